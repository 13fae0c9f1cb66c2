"""The one validation of a DCP directory, in-process, on directories laid out the way torch writes them.

Each class of damage is shown twice: torch's own loader takes the directory without a word
(so the check cannot be left to it), and :mod:`ckpt_tools.dcp.validate` names it in one line.
The directories are laid out by :func:`tests.support.dcp_damage.write_dcp` the way torch's
``FileSystemWriter`` does for a row-sharded save; torch's loader reading one back (and a
directory ``dcp.save`` wrote passing the check) is the check of that builder.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.metadata import MetadataIndex

from ckpt_tools.dcp import validate
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.dcp.table import TableBuilder
from ckpt_tools.errors import CorruptCheckpoint, UnsafeCheckpoint
from ckpt_tools.format import layout as L
from ckpt_tools.format.record import Topology, TrainingStep, training_step_json
from ckpt_tools.inspect import inspect_path
from ckpt_tools.resume.verify import verify_resume
from ckpt_tools.train.checkpoint.safe_dcp import require_valid_dcp_inputs
from devtools.reliability.fuzz_mutations import load_torch_metadata, save_torch_metadata
from tests.support import dcp_damage as damage

WEIGHT = torch.arange(40, dtype=torch.float32).reshape(10, 4)  # rows [0,5) on rank 0, [5,10) on rank 1


def torch_loads(directory: Path) -> torch.Tensor:
    """What torch's DCP loader puts into a NaN-filled ``model.w`` (it raises nothing for any case here)."""
    state = {"model": {"w": torch.full((10, 4), float("nan"))}}
    dcp.load(state, checkpoint_id=directory, no_dist=True)
    return state["model"]["w"]


@pytest.fixture
def model_dcp(tmp_path: Path) -> Path:
    return damage.write_dcp(tmp_path / "run" / "pytorch_model_fsdp_0", {"model.w": WEIGHT})


def problems_of(directory: Path) -> list[validate.Problem]:
    return validate.problems(ChunkIndex.load(directory))


# ---------------------------------------------------------------------- the four classes the trainer met

CLASSES: dict[str, tuple[Callable[[Path], str], str]] = {
    "storage path outside the checkpoint": (
        lambda d: damage.shard_of_another_run(d, d.parent.parent / "other_run"),
        "'../../other_run/__1_0.distcp': shard path leaves the checkpoint directory",
    ),
    "tensor missing its last chunk": (
        lambda d: damage.drop_last_chunk(d, "model.w"),
        "model.w: chunks cover 20 of 40 elements (missing chunks)",
    ),
    "int32 archive where .metadata says float32": (
        lambda d: damage.int32_chunk(d, "model.w"),
        "__0_0.distcp (model.w chunk at [0, 0]): holds int32[5, 4], .metadata says float32[5, 4]",
    ),
    "overlapping chunks": (
        lambda d: damage.overlapping_chunks(d, "model.w"),
        "model.w: chunks overlap (unsupported sharding layout or corrupt metadata)",
    ),
}


def test_the_builder_writes_what_torch_reads(model_dcp: Path) -> None:
    assert torch.equal(torch_loads(model_dcp), WEIGHT)
    assert problems_of(model_dcp) == []


def test_a_directory_torch_itself_saved_is_valid(tmp_path: Path) -> None:
    state = {"model": {"w": WEIGHT, "s": torch.tensor(3)}, "optim": {"param_groups": [{"lr": 0.1, "params": [0]}]}}
    dcp.save(state, checkpoint_id=tmp_path / "saved", no_dist=True)
    index = validate.require_valid_dir(tmp_path / "saved")
    assert set(index.tensors) == {"model.w", "model.s"}
    assert index.byte_items and all(fqn.startswith("optim.param_groups.") for fqn in index.byte_items)


@pytest.mark.parametrize("name", list(CLASSES))
def test_torch_loads_each_class_without_a_word_and_validate_names_it(model_dcp: Path, name: str) -> None:
    apply, reason = CLASSES[name]
    assert apply(model_dcp) == reason
    loaded = torch_loads(model_dcp)  # no error from torch
    if name == "storage path outside the checkpoint":
        assert torch.equal(loaded, WEIGHT)  # rows 5..9 read from the other run's file
    elif name == "tensor missing its last chunk":
        assert torch.isnan(loaded[5:]).all()  # rows left at whatever the model held
    elif name == "int32 archive where .metadata says float32":
        assert torch.equal(loaded, WEIGHT)  # cast silently: an int32 chunk passes for float32
    else:
        assert torch.equal(loaded[4], WEIGHT[5]) and torch.isnan(loaded[9]).all()  # one chunk over the other
    found = problems_of(model_dcp)
    assert [p.message for p in found] == [reason]
    with pytest.raises(UnsafeCheckpoint if found[0].unsafe else CorruptCheckpoint) as raised:
        validate.require_valid_dir(model_dcp)
    assert str(raised.value) == reason


def test_only_the_path_class_is_unsafe(tmp_path: Path) -> None:
    unsafe = {}
    for i, (name, (apply, _)) in enumerate(CLASSES.items()):
        directory = damage.write_dcp(tmp_path / str(i) / "dcp", {"model.w": WEIGHT})
        apply(directory)
        unsafe[name] = [p.unsafe for p in problems_of(directory)]
    assert unsafe == {name: [name == "storage path outside the checkpoint"] for name in CLASSES}


# ---------------------------------------------------------------------- the other paths


def test_absolute_storage_path_is_refused(model_dcp: Path) -> None:
    md = load_torch_metadata(model_dcp)
    for info in md.storage_data.values():
        info.relative_path = str(model_dcp / info.relative_path)
    save_torch_metadata(model_dcp, md)
    found = problems_of(model_dcp)
    assert found and all(p.unsafe and "shard path leaves the checkpoint directory" in p.message for p in found)


def test_shard_symlinked_out_is_refused(model_dcp: Path) -> None:
    outside = model_dcp.parent / "elsewhere.distcp"
    os.replace(model_dcp / "__1_0.distcp", outside)
    (model_dcp / "__1_0.distcp").symlink_to(outside)
    (found,) = problems_of(model_dcp)
    assert found.unsafe and found.message == "'__1_0.distcp': shard file is a symlink that leads outside the checkpoint"


def test_missing_and_non_regular_shard_files(model_dcp: Path) -> None:
    (model_dcp / "__1_0.distcp").unlink()
    assert [p.message for p in problems_of(model_dcp)] == [f"{model_dcp / '__1_0.distcp'}: shard file missing"]
    (model_dcp / "__1_0.distcp").mkdir()
    assert [p.message for p in problems_of(model_dcp)] == [f"{model_dcp / '__1_0.distcp'}: not a regular file"]


def test_span_past_the_end_of_its_file(model_dcp: Path) -> None:
    size = (model_dcp / "__1_0.distcp").stat().st_size
    os.truncate(model_dcp / "__1_0.distcp", size - 10)
    (found,) = problems_of(model_dcp)
    assert found.message.startswith("model.w: chunk span 0+") and "truncated file" in found.message


def test_chunk_without_storage_entry_and_chunk_outside_the_tensor(model_dcp: Path) -> None:
    md = load_torch_metadata(model_dcp)
    del md.storage_data[MetadataIndex("model.w", torch.Size([5, 0]))]
    save_torch_metadata(model_dcp, md)
    assert [p.message for p in problems_of(model_dcp)] == [
        "model.w chunk at [5, 0]: no storage entry in .metadata (incomplete save?)"
    ]
    md.state_dict_metadata["model.w"].size = torch.Size([9, 4])
    save_torch_metadata(model_dcp, md)
    assert "model.w: chunk at [5, 0] of size [5, 4] sticks out of [9, 4]" in [p.message for p in problems_of(model_dcp)]


def test_structure_problems_come_before_any_archive_is_read(model_dcp: Path) -> None:
    """A broken layout is reported as such; the archives are read only once it is sound."""
    damage.int32_chunk(model_dcp, "model.w")
    (model_dcp / "__1_0.distcp").unlink()
    assert [p.message for p in problems_of(model_dcp)] == [f"{model_dcp / '__1_0.distcp'}: shard file missing"]


# ---------------------------------------------------------------------- non-tensor items


class RunsCode:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("true",))


def test_non_tensor_items_must_be_plain_data(tmp_path: Path) -> None:
    plain = damage.write_dcp(
        tmp_path / "plain", {"optim.w": WEIGHT}, {"optim.param_groups": [{"lr": 0.1, "params": [0]}]}
    )
    assert problems_of(plain) == []
    hostile = damage.write_dcp(tmp_path / "hostile", {"optim.w": WEIGHT}, {"optim.param_groups": RunsCode()})
    (found,) = problems_of(hostile)
    assert found.unsafe and "refused to load global posix.system" in found.message


def test_require_valid_raises_unsafe_problems_first() -> None:
    found = [validate.Problem("a: corrupt"), validate.Problem("b: escapes", unsafe=True)]
    with pytest.raises(UnsafeCheckpoint, match="b: escapes"):
        validate.require_valid(found)
    validate.require_valid([])


# ---------------------------------------------------------------------- tiling, exhaustively

boxes = st.integers(min_value=1, max_value=3).flatmap(
    lambda nd: st.lists(
        st.tuples(st.tuples(*[st.integers(0, 5)] * nd), st.tuples(*[st.integers(0, 3)] * nd)),
        min_size=1,
        max_size=7,
    )
)


@settings(max_examples=300, deadline=None)
@given(boxes)
def test_tiling_check_agrees_with_brute_force(raw: list) -> None:
    """Chunks are reported fine exactly when they lie inside the tensor, never overlap and cover it."""
    shape = tuple(max(off[i] + size[i] for off, size in raw) for i in range(len(raw[0][0])))
    builder = TableBuilder()
    t = builder.tensor("t", "float32", shape)
    for off, size in raw:
        builder.chunk(t, off, size)
    nonempty = [(off, size) for off, size in raw if math.prod(size)]
    overlap = any(
        all(o1 < o2 + s2 and o2 < o1 + s1 for o1, s1, o2, s2 in zip(a[0], a[1], b[0], b[1], strict=True))
        for a, b in itertools.combinations(nonempty, 2)
    )
    covered = sum(math.prod(size) for _, size in nonempty) == math.prod(shape)
    assert (validate.tiling_problems(builder.build()) == []) == (not overlap and covered)


# ---------------------------------------------------------------------- one line for every reader


def test_inspect_verify_resume_and_the_trainer_give_the_same_line_for_several_problems(tmp_path: Path) -> None:
    """A chunk without a storage entry, then (later in the list) a shard read from another run:
    every reader leads with the unsafe one and counts the other, in the one line :func:`validate.summary` gives."""
    step = L.StepPaths(tmp_path / "run" / "checkpoints" / "000004")
    damage.write_dcp(step.model_dcp, {"model.w": WEIGHT})
    damage.write_dcp(step.optimizer_dcp, {"optimizer.state.w.exp_avg": WEIGHT})
    record = TrainingStep(step=4, samples_seen=8, topology=Topology(2, 1, 2), sharded=True)
    step.training_step.parent.mkdir(parents=True, exist_ok=True)
    step.training_step.write_text(training_step_json(record))
    md = load_torch_metadata(step.model_dcp)
    del md.storage_data[MetadataIndex("model.w", torch.Size([0, 0]))]
    save_torch_metadata(step.model_dcp, md)
    unsafe = damage.shard_of_another_run(step.model_dcp, tmp_path / "other_run")
    found = problems_of(step.model_dcp)
    assert [p.unsafe for p in found] == [False, True]  # the unsafe one comes second in the list
    line = f"{unsafe} (+1 more)"
    assert validate.summary(found) == line

    with pytest.raises(UnsafeCheckpoint) as raised:
        require_valid_dcp_inputs(step)
    assert str(raised.value) == line
    inspected = [c.message for c in inspect_path(step.model_dcp).checks if c.failed]
    assert inspected == [line]
    verified = {c.name: c.message for c in verify_resume(step.root).failures}
    assert verified["weights"] == f"{L.PRETRAINED_MODEL_DIR}/{L.MODEL_DCP_DIR}: {line}"
