"""The torch-free reader's pieces: restricted unpickling, zip parsing, chunk layouts, casting.

Inputs are made by torch (torch.save archives, real DCP metadata); the reader under test
never imports torch.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_tools.dcp import casting, validate
from ckpt_tools.dcp.assemble import Copy, tensor_pieces
from ckpt_tools.dcp.files import ShardFiles
from ckpt_tools.dcp.index import ChunkIndex, TensorEntry
from ckpt_tools.dcp.metadata import MAX_METADATA_BYTES, load_metadata, parse_metadata
from ckpt_tools.dcp.reader import read_chunk_layout
from ckpt_tools.dcp.table import TableBuilder
from ckpt_tools.errors import CorruptCheckpoint, UnsafeCheckpoint
from ckpt_tools.st import dtypes
from tests.support.dcp_fixtures import FSDP2_DCP, FSDP2_OPT
from tests.support.tables import same_tables

ST_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


# ---------------------------------------------------------------------- .metadata


def test_real_metadata_parses_into_plain_types(ckpts: Path) -> None:
    md = load_metadata(ckpts / FSDP2_DCP)
    t = md.tensor_id("model.extras.big")
    assert t is not None and md.dtypes[t] == "float32" and md.shapes[t] == (2600, 1030)
    assert [sizes for _, sizes in md.boxes(t)] == [(1300, 1030), (1300, 1030)]
    assert md.path_of("model.encoder.layers.0.linear1.weight") == ("model", "encoder.layers.0.linear1.weight")
    assert isinstance(md.checkpoint_id, str) and md.checkpoint_id.endswith("pytorch_model_fsdp_0")
    opt = load_metadata(ckpts / FSDP2_OPT)
    assert opt.path_of("optimizer.param_groups.0.lr") == ("optimizer", "param_groups", 0, "lr")


class Reduce:
    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, self.args)


@pytest.mark.parametrize(
    ("payload", "refused"),
    [
        (Reduce(os.system, "true"), "posix.system"),
        (Reduce(eval, "1+1"), "builtins.eval"),
        (Reduce(getattr, Path, "home"), "builtins.getattr"),
        (Reduce(torch._utils._rebuild_tensor_v2, 0), "torch._utils._rebuild_tensor_v2"),  # not in metadata
        (Reduce(torch.load, "x"), "torch.serialization.load"),
    ],
)
def test_metadata_refuses_every_other_global(payload: Any, refused: str) -> None:
    with pytest.raises(UnsafeCheckpoint, match=re.escape(f"refused to load global {refused}")):
        parse_metadata(pickle.dumps(payload))


def test_metadata_refuses_torch_attributes_that_are_not_dtypes() -> None:
    data = b"\x80\x04\x8c\x05torch\x8c\x04load\x93."  # STACK_GLOBAL torch.load
    with pytest.raises(UnsafeCheckpoint, match=r"torch\.load"):
        parse_metadata(data)


def test_metadata_size_cap_stops_a_bomb_before_reading(tmp_path: Path) -> None:
    (tmp_path / ".metadata").touch()
    os.truncate(tmp_path / ".metadata", MAX_METADATA_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(CorruptCheckpoint, match="larger than any real DCP metadata"):
        load_metadata(tmp_path)


def test_deeply_nested_pickle_is_an_error_not_a_crash() -> None:
    deep = b"\x80\x04" + b"]" * 200_000 + b"a" * 199_999 + b"."
    with pytest.raises(CorruptCheckpoint):
        parse_metadata(deep)


def test_metadata_with_wrong_field_types_is_corrupt(ckpts: Path) -> None:
    import torch.distributed.checkpoint.filesystem  # noqa: F401

    md = pickle.loads((ckpts / FSDP2_DCP / ".metadata").read_bytes())
    md.state_dict_metadata["model.extras.big"].size = "big"
    with pytest.raises(CorruptCheckpoint, match=r"model\.extras\.big"):
        parse_metadata(pickle.dumps(md))


# ---------------------------------------------------------------------- chunk archives


def saved(tensor: torch.Tensor, prefix: bytes = b"", suffix: bytes = b"") -> tuple[bytes, int, int]:
    buf = io.BytesIO()
    torch.save(tensor, buf)
    blob = buf.getvalue()
    return prefix + blob + suffix, len(prefix), len(blob)


def read_back(path: Path, entry: TensorEntry, out: str | None = None) -> bytes:
    """Bytes ``tensor_pieces`` produces for ``entry`` (chunks in ``path``'s directory)."""
    with ShardFiles(path.parent) as files:
        layouts = [read_chunk_layout(files.fd(c.file), c.offset, c.length, what=c.file) for c in entry.chunks]
        dtype = dtypes.lookup(out or entry.dtype)
        parts = []
        for piece in tensor_pieces(entry, layouts, files, dtype):
            if isinstance(piece, Copy):
                parts.append(os.pread(piece.fd, piece.length, piece.offset))
            else:
                parts.append(bytes(piece))
        return b"".join(parts)


def raw_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def single_chunk_entry(name: str, tensor: torch.Tensor, file: str, offset: int, length: int) -> TensorEntry:
    shape = tuple(tensor.shape)
    builder = TableBuilder()
    t = builder.tensor(name, str(tensor.dtype).removeprefix("torch."), shape)
    builder.chunk(t, (0,) * len(shape), shape)
    builder.storage(name, (0,) * len(shape), file, offset, length, 0)
    return ChunkIndex.from_table(Path("."), builder.build()).tensors[name]


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(10, dtype=torch.float32)[2:8],  # storage offset 2
        lambda: torch.arange(24, dtype=torch.float64).reshape(4, 6).t(),  # strides (1, 6)
        lambda: torch.arange(3, dtype=torch.int16).expand(4, 3),  # stride 0
        lambda: torch.arange(60, dtype=torch.int32).reshape(3, 4, 5)[:, ::2, 1:4],  # gaps
        lambda: torch.tensor(7, dtype=torch.int64),  # 0-d
        lambda: torch.randn(5, 3).to(torch.bfloat16).t(),
        lambda: torch.tensor([True, False, True]),
        lambda: torch.tensor([1, 2, 40000, 65535], dtype=torch.int32).to(torch.uint16),  # _rebuild_tensor_v3
    ],
)
def test_storage_offset_stride_and_dtype_are_honoured(tmp_path: Path, make: Any) -> None:
    tensor = make()
    blob, offset, length = saved(tensor, prefix=b"x" * 100, suffix=b"y" * 50)
    (tmp_path / "f.distcp").write_bytes(blob)
    entry = single_chunk_entry("t", tensor, "f.distcp", offset, length)
    assert read_back(tmp_path / "f.distcp", entry) == raw_bytes(tensor)


def rewrite_archive(blob: bytes, edit: Any, *, zip64: bool = False) -> bytes:
    """Rebuild a torch.save archive member by member (stored), editing members on the way."""
    src = zipfile.ZipFile(io.BytesIO(blob))
    out = io.BytesIO()
    limit = zipfile.ZIP64_LIMIT
    if zip64:
        zipfile.ZIP64_LIMIT = 8  # force zip64 extras and the zip64 end record, as >4 GiB members get
    try:
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
            for info in src.infolist():
                data = edit(info.filename, src.read(info.filename))
                dst.writestr(zipfile.ZipInfo(info.filename), data)
    finally:
        zipfile.ZIP64_LIMIT = limit
    return out.getvalue()


def test_zip64_archives_are_read(tmp_path: Path) -> None:
    tensor = torch.randn(6, 5)
    blob, _, _ = saved(tensor)
    z64 = rewrite_archive(blob, lambda name, data: data, zip64=True)
    assert b"PK\x06\x06" in z64  # really a zip64 end record
    (tmp_path / "f.distcp").write_bytes(b"\0" * 10 + z64)
    entry = single_chunk_entry("t", tensor, "f.distcp", 10, len(z64))
    assert read_back(tmp_path / "f.distcp", entry) == tensor.numpy().tobytes()


def test_big_endian_archives_are_swapped(tmp_path: Path) -> None:
    tensor = torch.arange(12, dtype=torch.int32).reshape(3, 4) * 1000003

    def to_big(name: str, data: bytes) -> bytes:
        if name.endswith("byteorder"):
            return b"big"
        if "/data/" in name:
            return np.frombuffer(data, "<i4").astype(">i4").tobytes()
        return data

    blob = rewrite_archive(saved(tensor)[0], to_big)
    (tmp_path / "f.distcp").write_bytes(blob)
    entry = single_chunk_entry("t", tensor, "f.distcp", 0, len(blob))
    assert read_back(tmp_path / "f.distcp", entry) == tensor.numpy().tobytes()


def test_a_chunk_of_a_dtype_safetensors_cannot_hold_is_still_read(tmp_path: Path) -> None:
    """complex128 has no safetensors code (convert-dcp skips it), but its chunk is read and checked like any other."""
    tensor = torch.complex(torch.arange(3.0, dtype=torch.float64), -torch.arange(3.0, dtype=torch.float64))
    blob, _, _ = saved(tensor)
    (tmp_path / "f.distcp").write_bytes(blob)
    fd = os.open(tmp_path / "f.distcp", os.O_RDONLY)
    try:
        layout = read_chunk_layout(fd, 0, len(blob), what="f.distcp")
    finally:
        os.close(fd)
    assert (layout.dtype.name, layout.dtype.itemsize, layout.size, layout.dtype.representable) == (
        "complex128",
        16,
        (3,),
        False,
    )
    assert (tmp_path / "f.distcp").read_bytes()[
        layout.data_offset : layout.data_offset + 48
    ] == tensor.numpy().tobytes()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[: len(b) // 2], "no zip end record"),
        (lambda b: b"JUNK" + b[4:], "not a torch.save zip archive"),
        (lambda b: b[:10], "too small"),
    ],
)
def test_damaged_archives_are_corrupt(tmp_path: Path, damage: Any, message: str) -> None:
    blob = damage(saved(torch.randn(4))[0])
    (tmp_path / "f.distcp").write_bytes(blob)
    fd = os.open(tmp_path / "f.distcp", os.O_RDONLY)
    try:
        with pytest.raises(CorruptCheckpoint, match=message):
            read_chunk_layout(fd, 0, len(blob), what="f.distcp")
    finally:
        os.close(fd)


def test_chunk_pickle_refuses_other_globals(tmp_path: Path) -> None:
    def evil(name: str, data: bytes) -> bytes:
        return pickle.dumps(Reduce(os.system, "true"), protocol=2) if name.endswith("data.pkl") else data

    blob = rewrite_archive(saved(torch.randn(4))[0], evil)
    (tmp_path / "f.distcp").write_bytes(blob)
    fd = os.open(tmp_path / "f.distcp", os.O_RDONLY)
    try:
        with pytest.raises(UnsafeCheckpoint, match=r"posix\.system"):
            read_chunk_layout(fd, 0, len(blob), what="f.distcp")
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- casting


SPECIAL = np.array(
    [
        0.0,
        -0.0,
        1.0,
        -1.0,
        np.inf,
        -np.inf,
        3.4028235e38,
        -3.4028235e38,
        1e-40,
        -1e-45,
        1.0 + 2**-8,
        1.0 + 3 * 2**-8,
        65504.0,
        65520.0,
        1e-8,
        6.1e-5,
        2.0**-24,
        2.0**-25,
    ],
    dtype=np.float32,
)


def torch_cast_bits(values: np.ndarray, src: str, dst: str) -> bytes:
    t = torch.from_numpy(values.copy()).to(ST_DTYPES[src]).to(ST_DTYPES[dst])
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("src", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("dst", ["float32", "bfloat16", "float16"])
def test_casting_matches_torch_bit_for_bit(src: str, dst: str) -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [SPECIAL, rng.standard_normal(5000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 5000)]
    )
    source = torch.from_numpy(values.astype(np.float32)).to(ST_DTYPES[src])
    raw = source.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    ours = bytes(casting.cast_bytes(raw, dtypes.BY_NAME[src], dtypes.BY_NAME[dst]))
    theirs = source.to(ST_DTYPES[dst]).contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    assert ours == theirs


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**32 - 1), min_size=1, max_size=64))
def test_bf16_rounding_matches_torch_for_any_bit_pattern(bit_patterns: list[int]) -> None:
    values = np.array(bit_patterns, dtype=np.uint32).view(np.float32)
    ours = casting.float32_to_bfloat16_bits(values)
    theirs = torch.from_numpy(values.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(values)
    assert np.array_equal(ours[~nan], theirs[~nan])
    back = (ours.astype(np.uint32) << 16).view(np.float32)
    assert np.isnan(back[nan]).all()  # NaN stays NaN (torch's CPU kernel also keeps it a NaN)
    assert np.array_equal(np.signbit(back[nan]), np.signbit(values[nan]))  # with its sign


# ---------------------------------------------------------------------- the index


def test_index_reports_per_rank_bytes_from_file_names(ckpts: Path) -> None:
    index = ChunkIndex.load(ckpts / FSDP2_DCP)
    ranks = index.ranks()
    assert [r.rank for r in ranks] == [0, 1]
    for r in ranks:
        assert r.file_bytes == sum((ckpts / FSDP2_DCP / f).stat().st_size for f in r.files)
        assert 0 < r.chunk_bytes <= r.file_bytes
    assert validate.problems(index) == [] and index.unreferenced_files() == []


def test_metadata_in_the_older_sharded_tensor_classes_parses(ckpts: Path) -> None:
    """torch <= 2.1 pickled TensorProperties from torch.distributed._shard.sharded_tensor.metadata."""
    import torch.distributed._shard.sharded_tensor.metadata as old
    import torch.distributed.checkpoint.filesystem  # noqa: F401

    md = pickle.loads((ckpts / FSDP2_DCP / ".metadata").read_bytes())
    for item in md.state_dict_metadata.values():
        if hasattr(item, "properties"):
            item.properties = old.TensorProperties(dtype=item.properties.dtype)
    data = pickle.dumps(md)
    assert b"sharded_tensor.metadata" in data
    parsed = parse_metadata(data)
    assert parsed.dtypes[parsed.names.index("model.extras.bf16")] == "bfloat16"
    assert same_tables(parsed, load_metadata(ckpts / FSDP2_DCP))
