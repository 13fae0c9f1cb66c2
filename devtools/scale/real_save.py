"""The reference: torch's own save of a small Llama, the way the trainer saves (run under torchrun).

    torchrun --nproc-per-node=4 devtools/scale/real_save.py OUT

For each case of :mod:`devtools.scale.cases`: the model sharded with ``fully_shard`` per layer
and at the root on the case's mesh (the trainer's wrapping), the trainer's AdamW and LR
schedule stepped once, the state dicts taken by the trainer's own functions
(``state_dicts.sharded_model_state`` / ``sharded_optimizer_state``) and written by its own
``dcp_io.dcp_save`` - no CRC32, cached plans, the writeback writer - into
``OUT/<case>/checkpoints/.000001.partial/`` as the trainer does, then renamed into place.
Only the writer thread count is set per case (the trainer derives it from the cores).
Rank 0 writes ``OUT/DONE`` last.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.planner import SavePlanner
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from ckpt_tools.format import layout
from ckpt_tools.format.record import layout_for
from ckpt_tools.train.checkpoint import dcp_io, state_dicts
from ckpt_tools.train.loop import make_scheduler
from ckpt_tools.train.parallel.wrap import ParallelModel
from devtools.scale.cases import CASES, LAUNCH_RANKS, RUN, Case
from devtools.scale.llama import Llama
from devtools.scale.run import train_config
from devtools.scale.shapes import TINY


def case_mesh(case: Case) -> tuple[DeviceMesh, object]:
    """Collective over the whole launch (a sub-mesh's process group is created by every rank):
    the case's mesh as the trainer builds it, and the process group its save runs on."""
    world = case.world
    if world.size < LAUNCH_RANKS:
        mesh = DeviceMesh("cpu", list(range(world.size)), mesh_dim_names=("dp_shard",))
        return mesh, mesh.get_group() if dist.get_rank() < world.size else None
    if world.dp_replicate > 1:
        return init_device_mesh(
            "cpu", (world.dp_replicate, world.dp_shard), mesh_dim_names=("dp_replicate", "dp_shard")
        ), None
    return init_device_mesh("cpu", (world.dp_shard,), mesh_dim_names=("dp_shard",)), None


def save_case(out: Path, case: Case, mesh: DeviceMesh, group: object) -> None:
    """Collective over the case's ranks (the first ``case.world.size`` of the launch)."""
    world = case.world
    torch.manual_seed(0)
    model = Llama(TINY)
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    cfg = train_config(world, RUN, out)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.optimizer.lr,
        betas=tuple(cfg.optimizer.betas),
        eps=cfg.optimizer.eps,
        weight_decay=cfg.optimizer.weight_decay,
    )
    scheduler = make_scheduler(cfg, optimizer)
    torch.manual_seed(1 + dist.get_rank())
    model(torch.randint(0, TINY.vocab_size, (2, 5))).float().pow(2).mean().backward()
    optimizer.step()
    scheduler.step()
    parallel = ParallelModel(model, model, layout_for(world.size, world.dp_replicate, world.dp_shard),
                             world.dp_replicate, world.dp_shard, mesh)  # fmt: skip
    model_state = state_dicts.sharded_model_state(parallel, None)
    optimizer_state = state_dicts.sharded_optimizer_state(parallel, optimizer)
    _forget_cached_plans()  # each case is a run's first save
    dcp_io.writer_threads_per_rank = lambda: case.threads
    name = layout.step_dir_name(RUN.step, RUN.steps)
    partial = out / case.label / layout.CHECKPOINTS_DIR / layout.partial_dir_name(name)
    dcp_io.dcp_save(
        {layout.MODEL_DCP_KEY: model_state}, partial / layout.PRETRAINED_MODEL_DIR / layout.MODEL_DCP_DIR, group
    )
    dcp_io.dcp_save({layout.OPTIMIZER_DCP_KEY: optimizer_state}, partial / layout.TRAINING_STATE_DIR / layout.OPTIMIZER_DCP_DIR, group)  # fmt: skip
    dist.barrier(group=group)
    if dist.get_rank() == 0:
        partial.rename(partial.with_name(name))


def _forget_cached_plans() -> None:
    for attr in dir(SavePlanner):
        if attr.startswith("_cached") and isinstance(getattr(SavePlanner, attr), dict):
            getattr(SavePlanner, attr).clear()


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    assert dist.get_world_size() == LAUNCH_RANKS, f"run with --nproc-per-node={LAUNCH_RANKS}"
    for case in CASES:
        mesh, group = case_mesh(case)
        if dist.get_rank() < case.world.size:
            save_case(out, case, mesh, group)
        dist.barrier()
    if dist.get_rank() == 0:
        (out / "DONE").write_text("ok")
    dist.barrier()
    gc.collect()  # drop gloo work before teardown (see ckpt_tools.train.parallel.distributed.teardown)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
