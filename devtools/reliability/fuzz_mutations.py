"""Ways to break a real checkpoint: what a crash, a bad copy or an attacker does to it.

Each family takes a fresh copy of a checkpoint (inside a case *arena*, see
:mod:`devtools.reliability.fuzz_runner`) and a ``random.Random`` for its choices, damages the copy and
returns a :class:`Mutation`: what was done (for the report and for reproducing it), which
files it touched, and which readers can never legitimately succeed on the result.

``.metadata`` files are edited by loading them with torch's own classes: the pristine files
were written by torch in this test session, so that load is trusted; the *mutated* file is
only ever read by the code under test.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_tools.format import layout
from devtools.reliability import fuzz_payloads as P

MODEL_DCP = "pretrained_model/pytorch_model_fsdp_0"
OPTIMIZER_DCP = "training_state/optimizer_0"
JSON_FILES = (
    "training_state/training_step.json",
    "pretrained_model/train_config.json",
    "pretrained_model/config.json",
    "pretrained_model/adapter_config.json",
    "training_state/optimizer_param_groups.json",
    "training_state/scheduler_state.json",
)
# Reader names (see fuzz_runner.READERS).
CONVERT_MODEL = "convert"
CONVERT_OPTIMIZER = "convert_optimizer"
CONVERT_DELETE = "convert_delete"
VERIFY = "verify"
INSPECT = "inspect"
PLAN = "plan"
PUSH = "push"  # its reading and validation stage, up to the network (hub.prepare_push)
ANY_MODEL_CONVERT = frozenset({CONVERT_MODEL, CONVERT_DELETE})


@dataclass
class Arena:
    """The directories of one fuzz case; payloads aim at ``sentinel``, symlinks at ``outside``."""

    root: Path
    step_rel: str = "ckpt/checkpoints/000004"

    @property
    def ckpt(self) -> Path:
        return self.root / "ckpt"

    @property
    def checkpoints(self) -> Path:
        return self.ckpt / "checkpoints"

    @property
    def step(self) -> Path:
        return self.root / self.step_rel

    @property
    def outside(self) -> Path:
        return self.root / "outside"

    @property
    def secret(self) -> Path:
        return self.outside / "secret.bin"

    @property
    def sentinel(self) -> Path:
        return self.outside / "PWNED"

    @property
    def out(self) -> Path:
        return self.root / "out"


@dataclass
class Mutation:
    family: str
    detail: str
    touched: list[str] = field(default_factory=list)  # paths relative to the step dir ("" = the root)
    must_fail: frozenset[str] = frozenset()  # readers that must not succeed (error, or a failed verdict)

    def touches(self, prefix: str) -> bool:
        return any(t == "" or t.startswith(prefix) or prefix.startswith(t) for t in self.touched)


Family = Callable[[Arena, random.Random], Mutation]


# ----------------------------------------------------------------- helpers


def files_of(step: Path) -> list[str]:
    """Regular files of a step dir, relative, sorted (hidden ones such as .metadata included)."""
    out = []
    for dirpath, _dirs, names in os.walk(step):
        for name in names:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                out.append(str(path.relative_to(step)))
    return sorted(out)


def dcp_dirs(step: Path) -> list[str]:
    return [d for d in (MODEL_DCP, OPTIMIZER_DCP) if (step / d / ".metadata").is_file()]


def load_torch_metadata(dcp_dir: Path) -> Any:
    import torch.distributed.checkpoint.filesystem  # noqa: F401  (registers _StorageInfo for pickle)

    with open(dcp_dir / ".metadata", "rb") as f:
        return pickle.load(f)  # the pristine file, written by torch in this session


def save_torch_metadata(dcp_dir: Path, metadata: Any) -> None:
    with open(dcp_dir / ".metadata", "wb") as f:
        pickle.dump(metadata, f)


def flip_bits(path: Path, lo: int, hi: int, rng: random.Random, count: int) -> list[int]:
    data = bytearray(path.read_bytes())
    hi = min(hi, len(data))
    if hi <= lo:
        return []
    flipped = []
    for _ in range(count):
        pos = rng.randrange(lo, hi)
        data[pos] ^= 1 << rng.randrange(8)
        flipped.append(pos)
    path.write_bytes(bytes(data))
    return flipped


def append_blob(dcp_dir: Path, shard: str, blob: bytes) -> tuple[int, int]:
    path = dcp_dir / shard
    offset = path.stat().st_size
    with open(path, "ab") as f:
        f.write(blob)
    return offset, len(blob)


def repoint(metadata: Any, fqn: str, shard: str, offset: int, length: int) -> None:
    """Make every storage entry of ``fqn`` point at ``shard[offset:offset+length]``."""
    found = False
    for key, info in metadata.storage_data.items():
        if key.fqn == fqn:
            info.relative_path, info.offset, info.length = shard, offset, length
            found = True
    assert found, fqn


def tensor_items(metadata: Any) -> list[str]:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    return sorted(k for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata))


def byte_items(metadata: Any) -> list[str]:
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    return sorted(k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata))


def _needed_for_resume(arena: Arena, rel: str) -> bool:
    """Does a resume read this file? (Weights come from the DCP dir when it has a .metadata.)"""
    if rel.startswith((MODEL_DCP, OPTIMIZER_DCP)):
        return rel.endswith((".metadata", ".distcp"))
    if rel == "pretrained_model/model.safetensors":
        return not (arena.step / MODEL_DCP / ".metadata").exists()
    return rel == "training_state/optimizer_state.safetensors"


def _published(rel: str) -> bool:
    """Does a push of the step read this file? (The top-level *.json / *.safetensors of pretrained_model/.)"""
    folder, _, name = rel.rpartition("/")
    return folder == "pretrained_model" and not name.startswith(".") and name.endswith((".json", ".safetensors"))


def _parses(path: Path) -> bool:
    try:
        json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        return False
    return True


def pick_dcp(arena: Arena, rng: random.Random) -> str:
    dirs = dcp_dirs(arena.step)
    return rng.choice(dirs) if dirs else ""


def _must_fail_for_dcp(dcp: str) -> frozenset[str]:
    """A DCP dir that cannot be read: converting it fails, and the checkpoint is not resumable."""
    return (ANY_MODEL_CONVERT if dcp == MODEL_DCP else frozenset({CONVERT_OPTIMIZER})) | {VERIFY}


# ----------------------------------------------------------------- byte-level damage


def truncate(arena: Arena, rng: random.Random) -> Mutation:
    rel = rng.choice(files_of(arena.step))
    path = arena.step / rel
    size = path.stat().st_size
    at = rng.choice([0, 1, 8, size // 2, max(0, size - 1), rng.randrange(0, max(1, size))])
    at = min(at, max(0, size - 1))
    os.truncate(path, at)
    must: frozenset[str] = frozenset()
    if rel.startswith(MODEL_DCP) and (rel.endswith(".metadata") or at < size) and not rel.endswith(layout.DCP_INDEX):
        must = ANY_MODEL_CONVERT  # (the chunk index is a shortcut: a damaged one is bypassed, see damaged_index)
    if _needed_for_resume(arena, rel):
        must = must | {VERIFY}
    if _published(rel) and at < size and (rel.endswith(".safetensors") or not _parses(path)):
        must = must | {PUSH}  # a safetensors file that lacks bytes, a JSON file no loader parses
    return Mutation("truncate", f"{rel} {size} -> {at} bytes", [rel], must)


def bitflip_safetensors_header(arena: Arena, rng: random.Random) -> Mutation:
    files = [f for f in files_of(arena.step) if f.endswith(".safetensors")]
    rel = rng.choice(files)
    path = arena.step / rel
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    flipped = flip_bits(path, 0, 8 + n, rng, rng.choice([1, 1, 2, 3]))
    return Mutation("bitflip_safetensors_header", f"{rel} bits at {flipped}", [rel])


def bitflip_metadata(arena: Arena, rng: random.Random) -> Mutation:
    dcp = pick_dcp(arena, rng) or "training_state"
    target = arena.step / dcp / ".metadata"
    if not target.exists():
        return bitflip_json(arena, rng)
    flipped = flip_bits(target, 0, target.stat().st_size, rng, rng.choice([1, 1, 2, 4]))
    return Mutation("bitflip_metadata", f"{dcp}/.metadata bits at {flipped}", [f"{dcp}/.metadata"])


def bitflip_archive(arena: Arena, rng: random.Random) -> Mutation:
    """Flip bits in a chunk's torch.save archive: zip headers, data.pkl or the tensor bytes."""
    from ckpt_tools.dcp.index import ChunkIndex

    dcp = pick_dcp(arena, rng)
    if not dcp:
        return truncate(arena, rng)
    index = ChunkIndex.load(arena.step / dcp)
    chunks = [c for e in index.tensors.values() for c in e.chunks if c.length]
    chunk = rng.choice(chunks)
    where = rng.choice(["head", "tail", "anywhere"])
    lo, hi = {
        "head": (chunk.offset, chunk.offset + 160),
        "tail": (chunk.offset + chunk.length - 200, chunk.offset + chunk.length),
        "anywhere": (chunk.offset, chunk.offset + chunk.length),
    }[where]
    flipped = flip_bits(arena.step / dcp / chunk.file, max(lo, chunk.offset), hi, rng, rng.choice([1, 2, 8]))
    return Mutation("bitflip_archive", f"{dcp}/{chunk.file} {where} bits at {flipped}", [f"{dcp}/{chunk.file}"])


def bitflip_json(arena: Arena, rng: random.Random) -> Mutation:
    files = [f for f in files_of(arena.step) if f.endswith(".json")]
    rel = rng.choice(files)
    path = arena.step / rel
    flipped = flip_bits(path, 0, path.stat().st_size, rng, rng.choice([1, 2, 3]))
    return Mutation("bitflip_json", f"{rel} bits at {flipped}", [rel])


def swap_files(arena: Arena, rng: random.Random) -> Mutation:
    files = files_of(arena.step)
    a, b = rng.sample(files, 2)
    pa, pb = arena.step / a, arena.step / b
    da, db = pa.read_bytes(), pb.read_bytes()
    if da == db:
        return truncate(arena, rng)
    pa.write_bytes(db)
    pb.write_bytes(da)
    return Mutation("swap_files", f"{a} <-> {b}", [a, b])


# ----------------------------------------------------------------- bombs


def safetensors_bomb(arena: Arena, rng: random.Random) -> Mutation:
    files = [f for f in files_of(arena.step) if f.endswith(".safetensors")]
    rel = rng.choice(files)
    path = arena.step / rel
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    names = [k for k in header if k != "__metadata__"]
    name = rng.choice(names)
    variant = rng.choice(
        [
            "declared_len_huge",
            "declared_len_2^63",
            "shape_1e15",
            "offsets_1e15",
            "shape_square_1e8",
            "many_entries",
            "negative_shape",
            "float_shape",
            "nested_header",
            "huge_int_text",
            "dtype_unknown",
        ]
    )
    declared = None
    if variant == "declared_len_huge":
        declared = 10**15
    elif variant == "declared_len_2^63":
        declared = 2**64 - 1
    elif variant == "shape_1e15":
        header[name] = {"dtype": "F32", "shape": [10**15], "data_offsets": [0, 4 * 10**15]}
    elif variant == "offsets_1e15":
        header[name]["data_offsets"] = [0, 10**15]
    elif variant == "shape_square_1e8":
        header[name]["shape"] = [10**8, 10**8]
    elif variant == "many_entries":
        header.update({f"x{i}": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]} for i in range(100_000)})
    elif variant == "negative_shape":
        header[name]["shape"] = [-1, 4]
    elif variant == "float_shape":
        header[name]["shape"] = [1.5, "x", None]
    elif variant == "dtype_unknown":
        header[name]["dtype"] = rng.choice(["F128", "", None, 7, ["F32"]])
    if variant == "nested_header":
        text = P.json_nesting_bomb(200_000).encode()
    elif variant == "huge_int_text":
        text = json.dumps(header).replace('"shape": [', '"shape": [' + "9" * 5000 + ", ", 1).encode()
    else:
        text = json.dumps(header).encode()
    n2 = len(text) if declared is None else declared
    path.write_bytes(struct.pack("<Q", n2) + text + data)
    must = frozenset({VERIFY}) if _needed_for_resume(arena, rel) else frozenset()
    return Mutation("safetensors_bomb", f"{rel} {variant} ({name})", [rel], must)


def metadata_bomb(arena: Arena, rng: random.Random) -> Mutation:
    """A ``.metadata`` that declares far more than the files hold: giant tensors, chunk floods."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorStorageMetadata

    dcp = pick_dcp(arena, rng)
    if not dcp:
        return safetensors_bomb(arena, rng)
    md = load_torch_metadata(arena.step / dcp)
    fqn = rng.choice([k for k in tensor_items(md) if len(md.state_dict_metadata[k].size)] or tensor_items(md))
    meta = md.state_dict_metadata[fqn]
    import torch

    variant = rng.choice(["giant_tensor", "giant_offsets", "chunk_flood", "shared_chunk_flood", "giant_length"])
    if variant == "giant_tensor":
        dims = rng.choice([(10**12, 10**6), (2**62,), (2**31, 2**31, 4)])
        meta.size = torch.Size(dims)
        meta.chunks = [ChunkStorageMetadata(torch.Size([0] * len(dims)), torch.Size(dims))]
        info = next(v for k, v in md.storage_data.items() if k.fqn == fqn)
        for key in [k for k in md.storage_data if k.fqn == fqn]:
            del md.storage_data[key]
        md.storage_data[MetadataIndex(fqn, torch.Size([0] * len(dims)))] = info
    elif variant == "giant_offsets":
        for chunk in meta.chunks:
            chunk.offsets = torch.Size([2**62] * len(chunk.offsets))
    elif variant == "chunk_flood":
        rows = max(1, len(meta.size) and meta.size[0])
        count = rng.choice([10_000, 60_000])
        meta.chunks = (
            [
                ChunkStorageMetadata(
                    torch.Size([i % rows] + [0] * (len(meta.size) - 1)), torch.Size([1, *meta.size[1:]])
                )
                for i in range(count)
            ]
            if meta.size
            else [ChunkStorageMetadata(torch.Size([]), torch.Size([])) for _ in range(count)]
        )
    elif variant == "shared_chunk_flood":
        # Many names share one object with many chunks: a few bytes per name, thousands of chunks each.
        shared = TensorStorageMetadata(
            meta.properties,
            torch.Size([4096]),
            [ChunkStorageMetadata(torch.Size([i]), torch.Size([1])) for i in range(4096)],
        )
        for i in range(rng.choice([500, 3000])):
            md.state_dict_metadata[f"{fqn}.bomb{i}"] = shared
    else:
        for key, info in md.storage_data.items():
            if key.fqn == fqn:
                info.length = 10**15
    save_torch_metadata(arena.step / dcp, md)
    return Mutation(
        "metadata_bomb", f"{dcp}/.metadata {variant} on {fqn}", [f"{dcp}/.metadata"], _must_fail_for_dcp(dcp)
    )


def _zip_central_entries(blob: bytes) -> list[int]:
    out, pos = [], 0
    while True:
        pos = blob.find(b"PK\x01\x02", pos)
        if pos < 0:
            return out
        out.append(pos)
        pos += 4


def zip_bomb(arena: Arena, rng: random.Random) -> Mutation:
    """A chunk archive whose zip records claim huge sizes, or that describes a huge tensor."""
    from ckpt_tools.dcp.index import ChunkIndex

    dcp = pick_dcp(arena, rng)
    if not dcp:
        return safetensors_bomb(arena, rng)
    index = ChunkIndex.load(arena.step / dcp)
    entry = rng.choice([e for e in index.tensors.values() if e.chunks and e.numel])
    chunk = rng.choice([c for c in entry.chunks if c.length])
    shard = arena.step / dcp / chunk.file
    data = bytearray(shard.read_bytes())
    span = bytes(data[chunk.offset : chunk.offset + chunk.length])
    variant = rng.choice(["central_sizes", "central_offset", "local_sizes", "expanded_giant", "storage_numel"])
    if variant in ("central_sizes", "central_offset"):
        entry_at = rng.choice(_zip_central_entries(span))
        (name_len,) = struct.unpack_from("<H", span, entry_at + 28)
        member = span[entry_at + 46 : entry_at + 46 + name_len].decode(errors="replace").split("/", 1)[-1]
        pos = chunk.offset + entry_at
        value = rng.choice([0xFFFFFFFE, 0x7FFFFFFF, 0xFFFFFFFF])
        fields = (20, 24) if variant == "central_sizes" else (42,)
        for f in fields:
            struct.pack_into("<I", data, pos + f, value)
        shard.write_bytes(bytes(data))
        needed = member == "data.pkl" or member.startswith("data/")
        must = _convert_of(dcp) if needed else frozenset()
        detail = f"{dcp}/{chunk.file} {variant}={value:#x} of {member}"
        return Mutation("zip_bomb", detail, [f"{dcp}/{chunk.file}"], must)
    if variant == "local_sizes":
        struct.pack_into("<II", data, chunk.offset + 18, 0xFFFFFFFE, 0xFFFFFFFE)
        shard.write_bytes(bytes(data))
        return Mutation("zip_bomb", f"{dcp}/{chunk.file} local header sizes", [f"{dcp}/{chunk.file}"])
    import torch

    md = load_torch_metadata(arena.step / dcp)
    if variant == "expanded_giant":
        # One float stored, viewed as a 2**31 x 4 tensor through zero strides: 32 GiB from 4 bytes.
        dims = rng.choice([(2**31, 4), (2**16, 2**15), (3 * 2**28,)])
        buf = io.BytesIO()
        torch.save(torch.zeros(1).expand(*dims), buf)
        offset, length = append_blob(arena.step / dcp, chunk.file, buf.getvalue())
        _replace_tensor(md, entry.fqn, dims, chunk.file, offset, length)
        save_torch_metadata(arena.step / dcp, md)
        touched = [f"{dcp}/{chunk.file}", f"{dcp}/.metadata"]
        return Mutation("zip_bomb", f"{dcp} {entry.fqn} expanded to {dims}", touched, _convert_of(dcp))
    # A storage reference claiming 10**15 elements, with a tiny data/0.
    pkl = _tensor_pickle(numel=10**15, size=(4,), stride=(1,))
    offset, length = append_blob(arena.step / dcp, chunk.file, P.torch_save_archive(pkl))
    repoint(md, entry.fqn, chunk.file, offset, length)
    save_torch_metadata(arena.step / dcp, md)
    touched = [f"{dcp}/{chunk.file}", f"{dcp}/.metadata"]
    return Mutation("zip_bomb", f"{dcp} {entry.fqn} storage numel 1e15", touched, _convert_of(dcp))


class _StorageRef:
    pass


def _tensor_pickle(numel: int, size: tuple[int, ...], stride: tuple[int, ...]) -> bytes:
    """``data.pkl`` of a torch.save'd float tensor over a storage that claims ``numel`` elements."""
    import collections

    import torch

    storage = _StorageRef()

    class Tensor:
        def __reduce__(self) -> tuple[Any, ...]:
            return (torch._utils._rebuild_tensor_v2, (storage, 0, size, stride, False, collections.OrderedDict()))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return ("storage", torch.FloatStorage, "0", "cpu", numel) if obj is storage else None

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(Tensor())
    return buf.getvalue()


def _convert_of(dcp: str) -> frozenset[str]:
    return ANY_MODEL_CONVERT if dcp == MODEL_DCP else frozenset({CONVERT_OPTIMIZER})


def _replace_tensor(md: Any, fqn: str, dims: tuple[int, ...], shard: str, offset: int, length: int) -> None:
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    meta = md.state_dict_metadata[fqn]
    zeros = torch.Size([0] * len(dims))
    meta.size = torch.Size(dims)
    meta.chunks = [ChunkStorageMetadata(zeros, torch.Size(dims))]
    for key in [k for k in md.storage_data if k.fqn == fqn]:
        del md.storage_data[key]
    md.storage_data[MetadataIndex(fqn, zeros)] = _StorageInfo(shard, offset, length)


# ----------------------------------------------------------------- pickles


def deep_pickle(arena: Arena, rng: random.Random) -> Mutation:
    dcp = pick_dcp(arena, rng)
    if not dcp:
        return json_wrong_types(arena, rng)
    where = rng.choice(["metadata", "chunk", "byte_item"])
    bomb = rng.choice(
        [
            P.nesting_bomb(rng.choice([1_000, 100_000, 1_000_000]), rng.choice(["list", "tuple", "dict"])),
            P.reference_bomb(rng.choice([8, 10, 12]), rng.choice([10, 16])),
        ]
    )
    return _place_pickle(arena, dcp, where, bomb, "deep_pickle", rng)


def callable_pickle(arena: Arena, rng: random.Random) -> Mutation:
    dcp = pick_dcp(arena, rng)
    if not dcp:
        return json_wrong_types(arena, rng)
    where = rng.choice(["metadata", "metadata", "chunk", "byte_item", "inside_metadata"])
    sentinel = str(arena.sentinel)
    if rng.random() < 0.2:
        payload = rng.choice(P.allowed_looking_tricks(sentinel))
        label = "allowed-looking trick"
    else:
        name, kind = rng.choice(P.CALLABLE_NAMES), rng.choice(P.CALLABLE_KINDS)
        payload = P.CallablePayload(name, kind).build(sentinel)
        label = f"{name} via {kind}"
    if where == "inside_metadata":
        md = load_torch_metadata(arena.step / dcp)
        target = rng.choice(["planner_data", "storage_meta", "state_dict_metadata", "version"])
        evil = _Evil(f"touch {sentinel}")
        if target == "planner_data":
            md.planner_data[next(iter(md.planner_data))] = evil
        elif target == "storage_meta":
            md.storage_meta = evil
        elif target == "state_dict_metadata":
            md.state_dict_metadata[rng.choice(tensor_items(md))].properties = evil
        else:
            md.version = evil
        save_torch_metadata(arena.step / dcp, md)
        must = _must_fail_for_dcp(dcp) | {INSPECT}
        return Mutation("callable_pickle", f"{dcp}/.metadata {target} = os.system(...)", [f"{dcp}/.metadata"], must)
    mutation = _place_pickle(arena, dcp, where, payload, "callable_pickle", rng)
    mutation.detail += f" ({label})"
    return mutation


class _Evil:
    """Pickles to ``os.system(command)``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def _place_pickle(arena: Arena, dcp: str, where: str, payload: bytes, family: str, rng: random.Random) -> Mutation:
    directory = arena.step / dcp
    if where == "metadata":
        (directory / ".metadata").write_bytes(payload)
        return Mutation(
            family, f"{dcp}/.metadata := payload", [f"{dcp}/.metadata"], _must_fail_for_dcp(dcp) | {INSPECT}
        )
    md = load_torch_metadata(directory)
    names = byte_items(md) if where == "byte_item" else tensor_items(md)
    if not names:
        names, where = tensor_items(md), "chunk"
    fqn = rng.choice(names)
    shard = sorted(p.name for p in directory.glob("*.distcp"))[0]
    offset, length = append_blob(directory, shard, P.torch_save_archive(payload))
    repoint(md, fqn, shard, offset, length)
    save_torch_metadata(directory, md)
    touched = [f"{dcp}/{shard}", f"{dcp}/.metadata"]
    must = _convert_of(dcp) if where == "chunk" else frozenset()
    return Mutation(family, f"{dcp} {where} {fqn} := payload archive", touched, must)


def build_pickle(arena: Arena, rng: random.Random) -> Mutation:
    """A pickle that BUILDs, SETITEMs or APPENDs onto an object its load did not create.

    A stand-in class, a function, a dtype stand-in, ``pathlib.PurePath``: all live as long as
    the process, so one accepted change would alter how every later file is read (the runner
    compares a fingerprint of them before and after the readers). The attack is the whole
    ``.metadata``, or spliced in front of the real one (which then parses as before), or in
    front of a real chunk's or non-tensor item's ``data.pkl``.
    """
    dcp = pick_dcp(arena, rng)
    if not dcp:
        return json_wrong_types(arena, rng)
    directory = arena.step / dcp
    attack = rng.choice(P.build_attacks())
    md = load_torch_metadata(directory)
    names = {"data": tensor_items(md), "plain": byte_items(md)}.get(attack.allowlist, [])
    if attack.allowlist == "metadata" or not names:
        meta = directory / ".metadata"
        where = rng.choice(["alone", "spliced"]) if attack.allowlist == "metadata" else "alone"
        meta.write_bytes(attack.alone() if where == "alone" else attack.before(meta.read_bytes()))
        must = _must_fail_for_dcp(dcp) | {INSPECT}
        return Mutation("build_pickle", f"{dcp}/.metadata := {attack.name} ({where})", [f"{dcp}/.metadata"], must)
    fqn = rng.choice(names)
    info = next(v for k, v in md.storage_data.items() if k.fqn == fqn)
    with open(directory / info.relative_path, "rb") as f:
        f.seek(info.offset)
        archive = f.read(info.length)
    blob = rewrite_data_pkl(archive, attack.before)
    offset, length = append_blob(directory, info.relative_path, blob)
    repoint(md, fqn, info.relative_path, offset, length)
    save_torch_metadata(directory, md)
    touched = [f"{dcp}/{info.relative_path}", f"{dcp}/.metadata"]
    must = _convert_of(dcp) if attack.allowlist == "data" else frozenset()
    return Mutation("build_pickle", f"{dcp} {fqn} data.pkl := {attack.name} + the real one", touched, must)


def rewrite_data_pkl(archive: bytes, edit: Callable[[bytes], bytes]) -> bytes:
    """A torch.save archive with the same members, ``data.pkl`` replaced by ``edit(data.pkl)``."""
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as src, zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as out:
        for info in src.infolist():
            info.CRC = None  # the trainer's DCP saves skip the CRC32 (zipfile would call it bad)
            with src.open(info) as member:
                data = member.read()
            out.writestr(info.filename, edit(data) if info.filename.endswith("/data.pkl") else data)
    return buf.getvalue()


WORK_BOMBS = (
    "list_bomb_in_offsets",
    "list_bomb_in_size",
    "tuple_bomb_key",
    "join",
    "call_args",
    "big_int_key",
    "long_name",
    "shared_name",
)


def metadata_work_bomb(arena: Arena, rng: random.Random) -> Mutation:
    """A ``.metadata`` whose reading would cost time or memory far beyond its size.

    One list shared 60 levels deep (2**60 leaves: a message that ``repr``s it never returns),
    a tuple of the same shape as a dict key (hashing never returns), a memoized string joined
    into a path 200 000 times, one list passed to ``torch.Size`` 50 000 times, a 200 kB
    integer as a dict key 20 000 times, a megabyte-long tensor name, one 4000-character shard
    name for 5 000 storage entries. Every reader must refuse each promptly (the runner's
    deadline) within its memory cap.
    """
    dcp = pick_dcp(arena, rng)
    if not dcp:
        return json_wrong_types(arena, rng)
    directory = arena.step / dcp
    variant = rng.choice(WORK_BOMBS)
    spliced = {
        "tuple_bomb_key": P.tuple_bomb_as_key,
        "join": P.join_bomb,
        "call_args": P.call_args_bomb,
        "big_int_key": P.big_int_key,
    }
    if variant in spliced:
        meta = directory / ".metadata"
        data = meta.read_bytes()
        meta.write_bytes(data[:2] + spliced[variant]() + data[2:])
    else:
        from torch.distributed.checkpoint.metadata import MetadataIndex

        md = load_torch_metadata(directory)
        fqn = rng.choice(tensor_items(md))
        meta = md.state_dict_metadata[fqn]
        if variant == "list_bomb_in_offsets":
            meta.chunks[0].offsets = [P.list_bomb(60)]
        elif variant == "list_bomb_in_size":
            meta.size = [1, P.list_bomb(60)]
        elif variant == "long_name":
            md.state_dict_metadata["x" * 2**20] = meta
        else:
            info = next(v for k, v in md.storage_data.items() if k.fqn == fqn)
            info.relative_path = "s" * 4000
            for i in range(5_000):
                md.storage_data[MetadataIndex(f"{fqn}.{i}", [i])] = info
        save_torch_metadata(directory, md)
    must = _must_fail_for_dcp(dcp) | {INSPECT}
    return Mutation("metadata_work_bomb", f"{dcp}/.metadata {variant}", [f"{dcp}/.metadata"], must)


# ----------------------------------------------------------------- paths, links and special files


def hostile_paths(arena: Arena, rng: random.Random) -> Mutation:
    variant = rng.choice(
        [
            "storage_dotdot",
            "storage_absolute",
            "storage_nul",
            "shard_symlink_out",
            "shard_symlink_in",
            "metadata_symlink_out",
            "dcp_dir_symlink_out",
            "file_to_dev_zero",
            "file_to_fifo",
            "file_to_dir",
            "dangling_symlink",
            "last_loop",
            "last_outside",
            "last_dangling",
        ]
    )
    dcp = pick_dcp(arena, rng)
    if variant.startswith(("storage_", "shard_", "metadata_", "dcp_dir")) and not dcp:
        variant = rng.choice(["file_to_dev_zero", "file_to_fifo", "file_to_dir", "dangling_symlink"])
    if variant.startswith("storage_"):
        md = load_torch_metadata(arena.step / dcp)
        key = rng.choice(list(md.storage_data))
        rel = {
            "storage_dotdot": rng.choice(
                ["../../../../outside/secret.bin", "..", "__0_0.distcp/../../../../../outside/secret.bin", "../" * 40]
            ),
            "storage_absolute": str(arena.secret),
            "storage_nul": "__0_0.distcp\x00../../x",
        }[variant]
        md.storage_data[key].relative_path = rel
        save_torch_metadata(arena.step / dcp, md)
        must = _convert_of(dcp) | {VERIFY} if variant != "storage_nul" else _convert_of(dcp)
        return Mutation("hostile_paths", f"{dcp} {key.fqn} relative_path={rel!r}", [f"{dcp}/.metadata"], must)
    if variant in ("shard_symlink_out", "shard_symlink_in"):
        shards = sorted(p.name for p in (arena.step / dcp).glob("*.distcp"))
        victim = arena.step / dcp / rng.choice(shards)
        original = victim.read_bytes()
        victim.unlink()
        if variant == "shard_symlink_out":
            arena.secret.write_bytes(original)  # the same bytes, outside: still refused
            os.symlink(arena.secret, victim)
            must = _convert_of(dcp) | {VERIFY}
        else:
            twin = victim.with_name("twin.bin")
            twin.write_bytes(original)
            os.symlink(twin.name, victim)
            must = frozenset()
        rel = str(victim.relative_to(arena.step))
        return Mutation("hostile_paths", f"{rel} -> {os.readlink(victim)}", [rel], must)
    if variant == "metadata_symlink_out":
        meta = arena.step / dcp / ".metadata"
        arena.secret.write_bytes(meta.read_bytes())
        meta.unlink()
        os.symlink(arena.secret, meta)
        return Mutation("hostile_paths", f"{dcp}/.metadata -> outside", [f"{dcp}/.metadata"], _must_fail_for_dcp(dcp))
    if variant == "dcp_dir_symlink_out":
        import shutil

        src = arena.step / dcp
        moved = arena.outside / "moved_dcp"
        shutil.move(str(src), moved)
        os.symlink(moved, src)
        return Mutation("hostile_paths", f"{dcp}/ -> outside copy", [dcp])
    if variant.startswith("last_"):
        last = arena.checkpoints / "last"
        last.unlink()
        target = {"last_loop": "last", "last_outside": str(arena.outside), "last_dangling": "999999"}[variant]
        os.symlink(target, last)
        return Mutation("hostile_paths", f"last -> {target}", [""])
    rel = rng.choice(files_of(arena.step))
    path = arena.step / rel
    path.unlink()
    if variant == "file_to_dev_zero":
        os.symlink(rng.choice(["/dev/zero", "/dev/urandom"]), path)
    elif variant == "file_to_fifo":
        os.mkfifo(path)
    elif variant == "file_to_dir":
        path.mkdir()
    else:
        os.symlink("does-not-exist", path)
    return Mutation("hostile_paths", f"{rel} {variant}", [rel])


# ----------------------------------------------------------------- JSON


WRONG_VALUES: tuple[Any, ...] = ("8", -1, 1.5, None, True, [], {}, [1, 2], {"a": 1}, 2**70, "", "ﬀ\u202e")


def json_wrong_types(arena: Arena, rng: random.Random) -> Mutation:
    candidates = [f for f in JSON_FILES if (arena.step / f).is_file()]
    rel = rng.choice([*candidates, "pretrained_model/adapter_config.json"])
    path = arena.step / rel
    doc: Any = json.loads(path.read_text()) if path.is_file() else {"base_model_name_or_path": "x", "r": 4}
    variant = rng.choice(["field", "field", "field", "whole", "nested_bomb", "huge_int", "bad_utf8", "nan"])
    if variant == "field" and isinstance(doc, dict):
        keys = _paths(doc)
        key_path = rng.choice(keys) if keys else []
        value = rng.choice(WRONG_VALUES)
        _set(doc, key_path, value)
        text = json.dumps(doc)
        detail = f"{'.'.join(map(str, key_path))} = {value!r}"
    elif variant == "whole":
        value = rng.choice([[], 7, "x", None, [doc]])
        text, detail = json.dumps(value), f"document = {value!r}"[:80]
    elif variant == "nested_bomb":
        text, detail = P.json_nesting_bomb(rng.choice([10_000, 200_000])), "nesting bomb"
    elif variant == "huge_int":
        text, detail = '{"step": ' + "9" * rng.choice([5000, 100_000]) + "}", "5000+ digit integer"
    elif variant == "bad_utf8":
        path.write_bytes(b"\xff\xfe{\x00" + bytes(rng.randrange(256) for _ in range(16)))
        touched = [rel, MODEL_DCP] if rel.endswith("adapter_config.json") else [rel]
        return Mutation("json_wrong_types", f"{rel} invalid UTF-8", touched, _json_must_fail(rel, unparsable=True))
    else:
        text, detail = '{"step": NaN, "samples_seen": Infinity, "batch_size": -Infinity}', "NaN / Infinity"
    path.write_text(text)
    touched = [rel, MODEL_DCP] if rel.endswith("adapter_config.json") else [rel]  # it makes the output PEFT-named
    must = (
        _json_must_fail(rel, unparsable=variant in ("nested_bomb", "huge_int")) if variant != "field" else frozenset()
    )
    return Mutation("json_wrong_types", f"{rel} {variant}: {detail}", touched, must)


def _json_must_fail(rel: str, *, unparsable: bool = False) -> frozenset[str]:
    """A resume needs a usable training_step.json / train_config.json; a push refuses a JSON file no loader parses."""
    must = frozenset({VERIFY}) if rel.endswith(("training_step.json", "train_config.json")) else frozenset()
    return must | {PUSH} if unparsable and _published(rel) else must


def _paths(doc: Any, prefix: list[Any] | None = None) -> list[list[Any]]:
    prefix = prefix or []
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append([*prefix, k])
            out.extend(_paths(v, [*prefix, k]))
    return out


def _set(doc: Any, key_path: list[Any], value: Any) -> None:
    node = doc
    for k in key_path[:-1]:
        node = node[k]
    if key_path:
        node[key_path[-1]] = value


def damaged_index(arena: Arena, rng: random.Random) -> Mutation:
    """The save's ``.metadata.index`` damaged or swapped: the tools must fall back to ``.metadata``.

    Flipped bits, a cut, the other DCP directory's index, or an index whose digest is right but
    whose columns hold a value no table can (re-digested after the edit). Nothing about the
    checkpoint itself changes, so every reader must answer as on the seed.
    """
    from ckpt_tools.dcp import index_file

    dirs = [d for d in dcp_dirs(arena.step) if (arena.step / d / ".metadata.index").is_file()]
    if not dirs:
        return bitflip_metadata(arena, rng)
    dcp = rng.choice(dirs)
    path = arena.step / dcp / ".metadata.index"
    how = rng.choice(["flip", "cut", "other", "lying"])
    if how == "flip":
        detail = f"bits at {flip_bits(path, 0, path.stat().st_size, rng, rng.choice([1, 2, 8]))}"
    elif how == "cut":
        size = path.stat().st_size
        at = rng.randrange(0, max(1, size))
        os.truncate(path, at)
        detail = f"cut to {at} of {size} bytes"
    elif how == "other" and len(dirs) > 1:
        other = next(d for d in dirs if d != dcp)
        shutil.copyfile(arena.step / other / ".metadata.index", path)
        detail = f"replaced by {other}'s index"
    else:
        import numpy as np

        table, binding = index_file.read_index(path.read_bytes(), what=str(path))
        column = rng.choice(["file", "start", "ndim", "transform"])
        values = getattr(table, column).copy()
        if values.size:
            values[rng.randrange(values.size)] = rng.choice([-(2**40), len(table.files) + 7, 2**62 + 5])
        setattr(table, column, values.astype(np.int64))
        path.write_bytes(index_file.index_bytes(table, binding))
        detail = f"a {column} value out of range, digest recomputed"
    return Mutation("damaged_index", f"{dcp}/.metadata.index {detail}", [f"{dcp}/.metadata.index"])


FAMILIES: dict[str, Family] = {
    "truncate": truncate,
    "bitflip_safetensors_header": bitflip_safetensors_header,
    "bitflip_metadata": bitflip_metadata,
    "bitflip_archive": bitflip_archive,
    "bitflip_json": bitflip_json,
    "swap_files": swap_files,
    "safetensors_bomb": safetensors_bomb,
    "metadata_bomb": metadata_bomb,
    "zip_bomb": zip_bomb,
    "deep_pickle": deep_pickle,
    "callable_pickle": callable_pickle,
    "build_pickle": build_pickle,
    "metadata_work_bomb": metadata_work_bomb,
    "hostile_paths": hostile_paths,
    "json_wrong_types": json_wrong_types,
    "damaged_index": damaged_index,
}
