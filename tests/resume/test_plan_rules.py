"""The rules reshard-plan is built on, held against torch's own code, and the resume target.

- FSDP2 dim-0 placement vs ``Shard.local_shard_size_and_offset`` (uneven tails, empty shards);
- the DCP read emulation vs ``create_read_items_for_chunk_list`` on random saved chunkings;
- the resume target: the trainer's start-up rules applied to the saved config merged with the flags.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorProperties, TensorStorageMetadata
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.distributed.tensor.placement_types import Shard

from ckpt_tools.dcp.table import ChunkTable, TableBuilder
from ckpt_tools.format.record import Topology, TrainingStep
from ckpt_tools.format.rules.startup import RunSettings, resolve_parallelism, setting_refusals, world_refusals
from ckpt_tools.format.train_config import SavedConfig
from ckpt_tools.resume.placement import dim0_shard, local_box
from ckpt_tools.resume.reads import Wanted, count_reads
from ckpt_tools.resume.target import TargetRequest, resolve_target


@settings(max_examples=300, deadline=None)
@given(dim0=st.integers(0, 70), shards=st.integers(1, 12), data=st.data())
def test_dim0_shard_matches_torch(dim0: int, shards: int, data: st.DataObject) -> None:
    index = data.draw(st.integers(0, shards - 1))
    rows, offset = Shard.local_shard_size_and_offset(dim0, shards, index)
    assert dim0_shard(dim0, shards, index) == (offset, rows)


def test_hsdp_rank_takes_its_dp_shard_coordinate() -> None:
    hsdp = Topology(world_size=6, dp_replicate=2, dp_shard=3)
    # rank 4 sits at (1, 1) of the (2, 3) mesh: rows 3..5 of 7 (chunk size 3), like rank 1.
    assert local_box((7, 5), hsdp, 4, sharded=True) == ((3, 0), (3, 5))
    assert local_box((7, 5), hsdp, 5, sharded=True) == ((6, 0), (1, 5))
    assert local_box((2, 5), hsdp, 5, sharded=True) == ((2, 0), (0, 5))  # empty shard at offset dim0
    assert local_box((), hsdp, 5, sharded=True) == ((), ())
    assert local_box((7, 5), Topology(3, 3, 1), 2, sharded=True) == ((0, 0), (7, 5))  # DDP: whole


def _saved_chunks(shape: tuple[int, ...], cuts: list[int], cols: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Dim-0 cuts, optionally also split in two along dim 1 (a 2-D sharded save)."""
    bounds = sorted({0, shape[0], *(c for c in cuts if 0 < c < shape[0])})
    rows = list(itertools.pairwise(bounds))
    if len(shape) == 1 or cols <= 1 or shape[1] < 2:
        return [((a, *([0] * (len(shape) - 1))), (b - a, *shape[1:])) for a, b in rows]
    half = shape[1] // 2
    out = []
    for a, b in rows:
        out.append(((a, 0), (b - a, half)))
        out.append(((a, half), (b - a, shape[1] - half)))
    return out


@settings(max_examples=200, deadline=None)
@given(
    dim0=st.integers(1, 40),
    dim1=st.integers(1, 6),
    ndim=st.sampled_from([1, 2]),
    cuts=st.lists(st.integers(0, 40), max_size=5),
    cols=st.integers(1, 2),
    world=st.integers(1, 6),
    sharded=st.booleans(),
)
def test_read_emulation_matches_dcp_planner(
    dim0: int, dim1: int, ndim: int, cuts: list[int], cols: int, world: int, sharded: bool
) -> None:
    shape = (dim0, dim1)[:ndim]
    saved = _saved_chunks(shape, cuts, cols)
    # Each saved chunk lives in its own span of a rank file, with a distinctive length.
    files = [f"__{i % 3}_0.distcp" for i in range(len(saved))]
    table = _table("model.w", shape, saved, files, [100 + i for i in range(len(saved))])
    saved_md = [ChunkStorageMetadata(list(o), list(s)) for o, s in saved]  # type: ignore[arg-type]
    md = TensorStorageMetadata(TensorProperties(), shape, saved_md)
    topology = Topology(world, 1, world) if world > 1 else Topology(1, 1, 1)
    for rank in range(world):
        box = local_box(shape, topology, rank, sharded=sharded)
        items = create_read_items_for_chunk_list("model.w", md, [ChunkStorageMetadata(list(box[0]), list(box[1]))])
        expected: Counter[str] = Counter()
        for item in items:
            i = item.storage_index.index
            expected[files[i]] += 100 + i
        assert _reads_of(table, box) == dict(expected), (rank, box, saved)


def _table(name: str, shape: tuple[int, ...], saved: list, files: list[str], lengths: list[int]) -> ChunkTable:
    builder = TableBuilder()
    t = builder.tensor(name, "float32", shape)
    for i, (offsets, sizes) in enumerate(saved):
        builder.chunk(t, offsets, sizes)
        builder.storage(name, offsets, files[i], 1000 * i, lengths[i], 0)
    return builder.build()


def _reads_of(table: ChunkTable, box: tuple[tuple[int, ...], tuple[int, ...]]) -> dict[str, int]:
    """Bytes per file one rank's ``box`` (a dim-0 range, whole elsewhere) reads, by the columnar emulation."""
    start = np.asarray([box[0][0] if box[0] else 0], dtype=np.int64)
    rows = np.asarray([box[1][0] if box[1] else 1], dtype=np.int64)
    totals = count_reads(table, [Wanted(0, start, rows)], 1, byte_items=False)
    return {name: nbytes for name, (nbytes, _) in totals.of_shard(0, table.files, []).items()}


def test_zero_dim_tensor_is_read_whole_on_every_rank() -> None:
    table = _table("optimizer.state.w.step", (), [((), ())], ["__1_0.distcp"], [77])
    topology = Topology(4, 2, 2)
    for rank in range(4):
        assert _reads_of(table, local_box((), topology, rank, sharded=True)) == {"__1_0.distcp": 77}


def test_resume_target_applies_the_start_up_rules_to_the_merged_config(tmp_path: Path) -> None:
    """The saved config, overridden by the request; the trainer's lines, then this tool's flags."""
    record = TrainingStep(step=4, topology=Topology(2, 1, 2), batch_size=8, grad_accum_steps=1)
    saved = {
        "parallelism": {"dp_replicate": 1, "dp_shard": 2},
        "checkpoint_format": "safetensors_dcp",
        "save_freq": 4,
        "accelerator": {"mixed_precision": "no", "gradient_accumulation": {"steps": 1}},
    }
    config = SavedConfig(tmp_path / "train_config.json", saved)
    same = resolve_target(config, record, TargetRequest())
    assert same.topology == Topology(2, 1, 2) and same.problems == ()
    on_one = resolve_target(config, record, TargetRequest(nproc=1))
    _, refusal = resolve_parallelism(1, 2, 1)
    assert refusal is not None and on_one.topology is None
    assert on_one.problems == (f"{refusal.message} (here: --dp-replicate 1 --dp-shard 1)",)
    ddp = resolve_target(config, record, TargetRequest(nproc=2, dp_shard=1, grad_accum=3))
    assert ddp.topology == Topology(2, 2, 1)
    mesh, world = world_refusals(RunSettings(checkpoint_format="safetensors_dcp"), 2)
    assert mesh == (2, 1)
    assert ddp.problems == (
        f"{world[0].message} (here: --checkpoint-format safetensors)",
        setting_refusals(RunSettings(save_freq=4, grad_accum_steps=3))[0].message,
    )
    # What the saved config alone refuses is listed too (the trainer refuses the resume at start-up).
    saved["optimizer"] = {"type": "sgd"}
    assert resolve_target(config, record, TargetRequest()).problems == (
        "--optimizer.type=sgd: only adamw is supported",
    )
    # Without a train_config.json the record's values are checked.
    assert resolve_target(None, record, TargetRequest(nproc=2)).topology == Topology(2, 1, 2)
