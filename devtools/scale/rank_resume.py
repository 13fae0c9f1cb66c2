"""What one rank of a resume spends before torch reads its first byte, at cluster scale, in one process.

A resume runs on every rank: the checks before the load (:func:`ckpt_tools.train.checkpoint.load.preflight_resume`,
:func:`~ckpt_tools.train.checkpoint.safe_dcp.require_valid_dcp_inputs`), then for each DCP
directory torch's ``Metadata`` (:func:`~ckpt_tools.train.checkpoint.safe_dcp.directory_torch_metadata`,
built only for the chunks the rank's tensors overlap) and torch's own load planning
(``set_up_planner`` + ``create_local_plan``). Nobody here can start 1024 processes, so one rank
is played: its state dict is made of DTensors on the meta device over a *fake* process group of
the saved world size (torch's ``FakeStore`` / ``fake`` backend) - the shapes and placements the
real rank would hold, with no data and no communication. Every phase runs the project's and
torch's real code on the real (generated) checkpoint.

    python -m devtools.scale.rank_resume /scratch/l70-1024/checkpoints/last --rank 517
    python -m devtools.scale.rank_resume STEP --every-chunk   # torch's Metadata of every chunk, for comparison
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path
from typing import Any

from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.format import layout as L
from ckpt_tools.format.record import TrainingStep


def _state(index: ChunkIndex, mesh: Any, placements: list[Any]) -> dict[str, Any]:
    """The rank's nested state dict for a DCP directory: a meta DTensor per saved tensor (0-d ones plain)."""
    import torch
    from torch.distributed.tensor import DTensor

    out: dict[str, Any] = {}
    table = index.table
    for t, shape in enumerate(table.shapes):
        dtype = getattr(torch, table.dtypes[t])
        if shape:
            local = _local_shape(shape, mesh, placements)
            value: Any = DTensor.from_local(
                torch.empty(local, dtype=dtype, device="meta"),
                mesh,
                placements,
                run_check=False,
                shape=torch.Size(shape),
                stride=torch.empty(shape, device="meta").stride(),
            )
        else:
            value = torch.empty((), dtype=dtype, device="meta")
        node = out
        path = [str(p) for p in table.paths[t]]
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def _local_shape(shape: tuple[int, ...], mesh: Any, placements: list[Any]) -> tuple[int, ...]:
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local, _ = compute_local_shape_and_global_offset(shape, mesh, placements)
    return tuple(local)


def measure(step: Path, rank: int, *, every_chunk: bool = False) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ckpt_tools.facts.record import read_record
    from ckpt_tools.train.checkpoint.load import preflight_resume
    from ckpt_tools.train.checkpoint.safe_dcp import (
        SafeLoadPlanner,
        directory_torch_metadata,
        require_valid_dcp_inputs,
    )

    paths = L.StepPaths(step.resolve())
    record: TrainingStep = read_record(paths)
    topology = record.topology
    assert topology is not None, "a step without a recorded topology"
    phases: dict[str, float] = {}
    clock = time.process_time()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.process_time()
        phases[name] = round(now - clock, 3)
        clock = now

    preflight_resume(paths.root)
    require_valid_dcp_inputs(paths)
    lap("checks before the load (every rank)")

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=topology.world_size)
    try:
        if topology.dp_replicate > 1:
            mesh = init_device_mesh("cpu", (topology.dp_replicate, topology.dp_shard))
            placements = [Replicate(), Shard(0)]
        else:
            mesh = init_device_mesh("cpu", (topology.dp_shard,))
            placements = [Shard(0)]
        states = {d: _state(ChunkIndex.load(paths.root / d), mesh, placements) for d in _dcp_dirs(paths)}
        lap("the rank's state dict (meta DTensors: setup, not the resume's)")
        metadata = {d: directory_torch_metadata(paths.root / d, None if every_chunk else s) for d, s in states.items()}
        lap("torch Metadata" + (" of every chunk" if every_chunk else " of the rank's chunks"))
        items = 0
        for d, state in states.items():
            planner = SafeLoadPlanner()
            planner.set_up_planner(state, metadata[d], is_coordinator=rank == 0)
            items += len(planner.create_local_plan().items)
        lap("torch's load planning (set_up_planner + create_local_plan)")
    finally:
        dist.destroy_process_group()
    chunks = sum(ChunkIndex.load(paths.root / d).table.rows for d in _dcp_dirs(paths))
    built = sum(len(md.storage_data) for md in metadata.values())
    return {
        "step": str(paths.root),
        "world_size": topology.world_size,
        "rank": rank,
        "chunks": chunks,
        "chunks_built": built,
        "read_items": items,
        "phases_cpu_s": phases,
        "total_cpu_s": round(sum(v for k, v in phases.items() if not k.startswith("the rank's state")), 3),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def _dcp_dirs(paths: L.StepPaths) -> list[str]:
    dirs = [f"{L.PRETRAINED_MODEL_DIR}/{L.MODEL_DCP_DIR}", f"{L.TRAINING_STATE_DIR}/{L.OPTIMIZER_DCP_DIR}"]
    return [d for d in dirs if (paths.root / d / L.DCP_METADATA).is_file()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", type=Path, help="a step dir (or a checkpoints root's last)")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--every-chunk", action="store_true", help="build torch's Metadata of every chunk")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.step, args.rank, every_chunk=args.every_chunk), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
