"""The restricted unpickler changes nothing it did not create, and its work is bounded by its input.

The hostile pickles are written opcode by opcode (``devtools/reliability/fuzz_payloads.py``):
``BUILD`` with a dict state or a ``(None, slotstate)`` state on a stand-in class, a function,
a dtype stand-in or ``pathlib.PurePath``, and the container opcodes on globals. Each load runs
in a forked child (:func:`~devtools.reliability.fuzz_runner.fenced`), so a loader that lets one
through changes that child, not the test session, and a loader that hangs is killed at the
deadline; the child reports what the load changed (:mod:`devtools.reliability.process_state`).
"""

from __future__ import annotations

import contextlib
import pickle
import shutil
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckpt_tools.convert import convert_dcp
from ckpt_tools.dcp import metadata, reader, validate
from ckpt_tools.dcp.metadata import parse_metadata
from ckpt_tools.dcp.safe_pickle import restricted_loads
from ckpt_tools.errors import CheckpointError, CkptError, CorruptCheckpoint, UnsafeCheckpoint
from devtools.reliability import fuzz_mutations as M
from devtools.reliability import fuzz_payloads as P
from devtools.reliability.fuzz_runner import fenced
from devtools.reliability.process_state import changes, fingerprint
from tests.support.tables import same_tables

ALLOWLISTS = {"metadata": metadata.METADATA_ALLOWLIST, "data": reader.TENSOR_ALLOWLIST, "plain": validate.PLAIN_OBJECTS}
ATTACKS = P.build_attacks()


def outcome(load: Any) -> dict[str, Any]:
    """Run ``load()`` (in the fenced child): how it ended, and what it changed in the process."""
    before = fingerprint()
    value = error = None
    message = ""
    try:
        value = load()
    except CkptError as e:
        error, message = type(e).__name__, str(e)
    return {"value": value, "error": error, "message": message, "changed": changes(before, fingerprint())}


def fenced_outcome(load: Any, timeout: float = 30) -> dict[str, Any]:
    result = fenced(lambda: outcome(load), timeout=timeout, memory_cap=1 << 30)
    assert result["status"] == "done", result  # no hang, no crash
    return result["value"]


def assert_one_line(message: str) -> None:
    assert message and "\n" not in message and len(message) < 400, message


# ---------------------------------------------------------------------- BUILD on shared objects


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_a_pickle_cannot_change_an_object_it_did_not_create(attack: P.BuildAttack) -> None:
    got = fenced_outcome(lambda: restricted_loads(attack.alone(), ALLOWLISTS[attack.allowlist], what="hostile.pkl"))
    assert got["changed"] == [], got
    assert got["error"] == "UnsafeCheckpoint" and got["message"].startswith("hostile.pkl: refused"), got
    assert_one_line(got["message"])


def test_build_state_must_name_declared_fields() -> None:
    # A fresh ChunkStorageMetadata (NEWOBJ) filled with a field torch's class does not have.
    data = (
        P.PROTO2 + b"ctorch.distributed.checkpoint.metadata\nChunkStorageMetadata\n)\x81}X\x04\x00\x00\x00evilK\x01sb."
    )
    with pytest.raises(CorruptCheckpoint, match="field 'evil', which torch's ChunkStorageMetadata does not have"):
        restricted_loads(data, metadata.METADATA_ALLOWLIST, what=".metadata")


def test_ext_opcodes_are_refused() -> None:
    with pytest.raises(UnsafeCheckpoint, match="copyreg extension code"):
        restricted_loads(P.ext_call(0x41), metadata.METADATA_ALLOWLIST, what=".metadata")


def _fp32_dcp(root: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A clean DCP directory of float32 tensors and one non-tensor item, written by torch."""
    torch.manual_seed(0)
    tensors = {"w": torch.randn(64, 32), "b": torch.arange(8, dtype=torch.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {**tensors, "hp": {"lr": 0.1}}}, checkpoint_id=root, no_dist=True)
    return root, tensors


def _hostile_copies(clean: Path, scratch: Path) -> list[Path]:
    """Copies of ``clean`` carrying each attack: spliced before the real .metadata, or before the
    real data.pkl of a chunk or of the non-tensor item (so the rest of each file is genuine)."""
    out = []
    for i, attack in enumerate(ATTACKS):
        copy = scratch / f"hostile{i}"
        shutil.copytree(clean, copy)
        if attack.allowlist == "metadata":
            (copy / ".metadata").write_bytes(attack.before((copy / ".metadata").read_bytes()))
        else:
            md = M.load_torch_metadata(copy)
            fqn = "model.w" if attack.allowlist == "data" else "model.hp.lr"
            info = next(v for k, v in md.storage_data.items() if k.fqn == fqn)
            with open(copy / info.relative_path, "rb") as f:
                f.seek(info.offset)
                archive = f.read(info.length)
            offset, length = M.append_blob(copy, info.relative_path, M.rewrite_data_pkl(archive, attack.before))
            M.repoint(md, fqn, info.relative_path, offset, length)
            M.save_torch_metadata(copy, md)
        out.append(copy)
    return out


def test_after_hostile_checkpoints_a_clean_one_converts_bit_exactly(tmp_path: Path) -> None:
    clean, tensors = _fp32_dcp(tmp_path / "clean")
    hostile = _hostile_copies(clean, tmp_path)
    out = tmp_path / "out"

    def hostile_then_clean() -> dict[str, Any]:
        from safetensors.torch import load_file

        refusals = []
        for i, copy in enumerate(hostile):
            try:  # the check inspect, verify-resume and the trainer make: reads every item's pickle
                validate.require_valid_dir(copy)
                refusals.append(None)
            except CheckpointError as e:
                refusals.append(type(e).__name__)
            with contextlib.suppress(CheckpointError):  # reads .metadata and the chunks, not the item
                convert_dcp(copy, output=tmp_path / f"out{i}", progress=False)
        (path,) = convert_dcp(clean, output=out, progress=False).output_files
        converted = load_file(str(path))
        return {
            "refusals": refusals,
            "dtypes": {k: str(v.dtype) for k, v in converted.items()},
            "exact": {k: torch.equal(v, tensors[k]) for k, v in converted.items()},
            "pathlib": Path("a") / "b" == Path("a/b"),
        }

    got = fenced_outcome(hostile_then_clean, timeout=120)
    assert got["changed"] == [], got  # the stand-ins, pathlib and the dtype tables are as they were
    r = got["value"]
    assert r["refusals"] == ["UnsafeCheckpoint"] * len(ATTACKS), r
    assert r["dtypes"] == {"w": "torch.float32", "b": "torch.float32"} and all(r["exact"].values()), r
    assert r["pathlib"]


def test_training_core_reads_metadata_without_touching_pathlib_or_torch(tmp_path: Path) -> None:
    from ckpt_tools.train.checkpoint.safe_dcp import SafeFileSystemReader, SafeLoadPlanner, load_torch_metadata

    clean, tensors = _fp32_dcp(tmp_path / "clean")
    hostile = tmp_path / "optimizer_0.metadata"
    attack = next(a for a in ATTACKS if a.name == "slot state on pathlib.PurePath")
    hostile.write_bytes(attack.before((clean / ".metadata").read_bytes()))

    def load_hostile_then_clean() -> None:
        try:
            load_torch_metadata(hostile)
        finally:
            # whatever happened, the clean one must still load into torch's own classes
            md = load_torch_metadata(clean / ".metadata")
            state = {"model": {k: torch.zeros_like(v) for k, v in tensors.items()} | {"hp": {"lr": 0.0}}}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dcp.load(state, storage_reader=SafeFileSystemReader(clean, md), planner=SafeLoadPlanner(), no_dist=True)
            assert all(torch.equal(state["model"][k], v) for k, v in tensors.items()) and state["model"]["hp"] == {
                "lr": 0.1
            }

    got = fenced_outcome(load_hostile_then_clean, timeout=60)
    assert got["changed"] == [], got
    assert got["error"] == "UnsafeCheckpoint" and "refused BUILD on the global pathlib.PurePath" in got["message"], got


def test_training_core_metadata_equals_torchs_own_reading(tmp_path: Path) -> None:
    from ckpt_tools.train.checkpoint.safe_dcp import load_torch_metadata

    clean, _ = _fp32_dcp(tmp_path / "clean")
    ours = load_torch_metadata(clean / ".metadata")
    theirs = M.load_torch_metadata(clean)  # torch's pickle.load of a file torch wrote here
    assert ours.state_dict_metadata == theirs.state_dict_metadata
    assert ours.storage_data == theirs.storage_data and ours.planner_data == theirs.planner_data


# ---------------------------------------------------------------------- work bounded by the file's size


def _list_bomb_metadata() -> bytes:
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    chunk = ChunkStorageMetadata([P.list_bomb(60)], torch.Size([4]))  # type: ignore[arg-type]
    meta = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([4]), [chunk])
    return pickle.dumps(Metadata({"w": meta}, storage_data={}))


@pytest.mark.timeout(60)
def test_a_shared_list_of_2_to_the_60_leaves_is_refused_at_once() -> None:
    data = _list_bomb_metadata()
    assert len(data) < 1000  # 2**60 leaves in under a kilobyte
    got = fenced_outcome(lambda: parse_metadata(data), timeout=20)
    assert got["error"] == "CorruptCheckpoint", got
    assert "'w' chunk offsets holds a list of 2 items, not a non-negative integer" in got["message"], got
    assert_one_line(got["message"])


BUDGET = "builds more than a pickle of its size can describe"
KEY = "a dict key or set member that is"
SPLICED_BOMBS = {  # what each one is refused for
    "a memoized string joined into a path 200 000 times": (P.join_bomb, BUDGET),
    "one list passed to torch.Size 50 000 times": (
        P.call_args_bomb,
        "torch.Size of something that is not a short tuple",
    ),
    "a tuple of 2**60 leaves as a dict key": (P.tuple_bomb_as_key, KEY + " a tuple of 2 items"),
    "a 200 kB integer as a dict key 20 000 times": (P.big_int_key, KEY + " an integer of 1599993 bits"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(SPLICED_BOMBS))
def test_work_that_grows_faster_than_the_file_is_refused_at_once(name: str) -> None:
    body, refusal = SPLICED_BOMBS[name]
    data = P.PROTO2 + body() + b"N."
    assert len(data) < 2**20
    got = fenced_outcome(lambda: parse_metadata(data), timeout=20)
    assert got["error"] == "CorruptCheckpoint" and refusal in got["message"], got
    assert_one_line(got["message"])


@pytest.mark.timeout(60)
def test_a_one_mebibyte_join_bomb_peaks_below_64_times_its_size() -> None:
    body = P.join_bomb(text_bytes=512 * 1024, parts=(2**20 - 512 * 1024 - 64) // 2)
    data = P.PROTO2 + body + b"N."
    assert 2**20 - 1024 < len(data) <= 2**20

    def peak() -> dict[str, Any]:
        tracemalloc.start()
        try:
            parse_metadata(data)
            message = ""
        except CorruptCheckpoint as e:
            message = str(e)
        return {"peak": tracemalloc.get_traced_memory()[1], "message": message}

    result = fenced(peak, timeout=20, memory_cap=2 << 30)
    assert result["status"] == "done", result
    assert "builds more than a pickle of its size can describe" in result["value"]["message"], result
    assert result["value"]["peak"] < 64 * len(data), result


def test_real_metadata_stays_eight_times_inside_every_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budgets are proportional to the file, with room to spare: at an eighth of each, and
    without their fixed allowance, a real file still reads (real files use under 1/10 of each)."""
    from ckpt_tools.dcp import safe_pickle

    clean, _ = _fp32_dcp(tmp_path / "clean")
    data = (clean / ".metadata").read_bytes()
    expected = parse_metadata(data)
    for module, name in ((metadata, "VALUES_PER_BYTE"), (metadata, "CHARS_PER_BYTE"), (safe_pickle, "WORK_PER_BYTE")):
        monkeypatch.setattr(module, name, getattr(module, name) / 8)
    monkeypatch.setattr(metadata, "BUDGET_BASE", 0)
    monkeypatch.setattr(safe_pickle, "WORK_BASE", 0)
    assert same_tables(parse_metadata(data), expected)


def test_an_ordered_dict_item_still_reads_as_plain_data() -> None:
    """torch pickles an OrderedDict as OrderedDict() then SETITEMS: the call's dict is fresh, fillable."""
    from collections import OrderedDict

    data = pickle.dumps(OrderedDict([("lr", 0.1), ("betas", (0.9, 0.99)), ("params", [0, 1])]), protocol=2)
    assert restricted_loads(data, validate.PLAIN_OBJECTS, what="item") == {
        "lr": 0.1,
        "betas": (0.9, 0.99),
        "params": [0, 1],
    }


def test_bytes_items_read_as_data_and_no_other_codec_call() -> None:
    """Protocol 2 (torch.save's) writes bytes as _codecs.encode(text, "latin1"), as torchtitan's dataloader state.

    That one call is allowed - it builds new bytes - and nothing else through ``_codecs``.
    """
    state = {"dp_rank_0": pickle.dumps({"epoch": 1}), "world_size": 3}
    data = pickle.dumps(state, protocol=2)
    assert b"_codecs" in data  # the fixture exercises the call, not a protocol-3 bytes opcode
    assert restricted_loads(data, validate.PLAIN_OBJECTS, what="item") == state
    rot13 = b"\x80\x02c_codecs\nencode\nq\x00X\x03\x00\x00\x00abcq\x01X\x05\x00\x00\x00rot13q\x02\x86q\x03Rq\x04."
    with pytest.raises(CorruptCheckpoint, match=r"_codecs.encode of 'abc' with 'rot13': not how pickle writes bytes"):
        restricted_loads(rot13, validate.PLAIN_OBJECTS, what="item")
    decode = b"\x80\x02c_codecs\ndecode\nq\x00X\x03\x00\x00\x00abcq\x01\x85q\x02Rq\x03."
    with pytest.raises(UnsafeCheckpoint, match=r"refused to load global _codecs.decode"):
        restricted_loads(decode, validate.PLAIN_OBJECTS, what="item")
