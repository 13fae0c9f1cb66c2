"""The start-up banner: layout, batch factorization, precision, wrap units, checkpoints."""

from __future__ import annotations

from ckpt_tools.format.record import BatchFactorization, Topology
from ckpt_tools.format.rules.scaling import linear_scaling
from ckpt_tools.format.rules.startup import saved_format
from ckpt_tools.train.config import TrainConfig
from ckpt_tools.train.parallel.precision import PrecisionPlan
from ckpt_tools.train.parallel.wrap import ParallelModel


def banner_lines(
    cfg: TrainConfig,
    topology: Topology,
    parallel: ParallelModel,
    precision: PrecisionPlan,
    n_params: int,
    n_trainable: int,
    dataset_size: int,
    backend: str,
    start_step: int = 0,
) -> list[str]:
    """The lines printed once at start-up; on a resume (``start_step`` > 0) the step, update and
    sample counts are what this launch still has to do, which is what a user sizing a restart
    wants to read, with the run's total beside them."""
    assert cfg.policy is not None
    batch = BatchFactorization(cfg.batch_size, topology.dp_world_size, cfg.grad_accum_steps)
    remaining = max(0, cfg.steps - start_step)
    updates = -(-cfg.steps // cfg.grad_accum_steps) - start_step // cfg.grad_accum_steps
    samples = remaining * batch.samples_per_step
    plan = (
        f"{cfg.steps} steps = {updates} optimizer updates"
        if start_step == 0
        else f"resuming after step {start_step}: {remaining} of {cfg.steps} steps left = {updates} optimizer updates"
    )
    lines = [
        f"ckpt-train: policy {cfg.policy.type}, {n_params:,} parameters ({n_trainable:,} trainable)",
        f"  layout      {topology.describe()}, backend {backend}",
        f"  batch       {batch.describe()}",
        f"              one step consumes {batch.samples_per_step} samples; {plan},"
        f" {samples:,} samples ({samples / dataset_size:.2f} epochs of {dataset_size:,})",
        f"  precision   {precision.describe()}",
    ]
    if parallel.sharded:
        lines.append(
            f"  wrap units  {len(parallel.wrap_units)} units ({', '.join(parallel.wrap_classes)}) + root;"
            f" reshard_after_forward={cfg.accelerator.fsdp.reshard_after_forward},"
            f" cpu_offload={cfg.accelerator.fsdp.cpu_offload}"
        )
    lr_line = f"  lr          {cfg.optimizer.lr:g} ({cfg.scheduler.type}); never scaled automatically"
    if topology.dp_world_size > 1:
        one_process = BatchFactorization(cfg.batch_size, 1, cfg.grad_accum_steps)
        scaling = linear_scaling(one_process, batch, lr=cfg.optimizer.lr, steps=cfg.steps)
        lr_line += f" - from 1 process, {scaling.describe()}"
    lines.append(lr_line)
    if cfg.save_checkpoint:
        fmt = saved_format(cfg.format, parallel.sharded).value
        lines.append(f"  checkpoints every {cfg.save_freq} steps → {cfg.output_dir}/checkpoints (format {fmt})")
    lines.extend(f"  note        {note}" for note in parallel.notes)
    return lines
