"""The training loop: build every component, resume if asked, train, checkpoint, finish."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ckpt_tools.cli.untrusted import echo
from ckpt_tools.errors import ConfigError
from ckpt_tools.format import layout
from ckpt_tools.format.record import Topology
from ckpt_tools.format.rules.resume_output import new_run_refusal, saved_step_dir
from ckpt_tools.format.rules.saved_hyperparameters import adamw_options
from ckpt_tools.train.checkpoint.load import LoadSource
from ckpt_tools.train.checkpoint.manager import CheckpointManager
from ckpt_tools.train.checkpoint.training_state import TrainingState
from ckpt_tools.train.config import TrainConfig
from ckpt_tools.train.data.dataset import RobotDataset, load_dataset, resolve_root
from ckpt_tools.train.data.processors import Pipeline, make_processors
from ckpt_tools.train.data.sampler import GlobalOrderSampler
from ckpt_tools.train.ema import EmaShadow, schedule_of
from ckpt_tools.train.nonfinite import NonFiniteGuard
from ckpt_tools.train.parallel import peft_support
from ckpt_tools.train.parallel.distributed import DistEnv
from ckpt_tools.train.parallel.groups import mesh_groups
from ckpt_tools.train.parallel.precision import make_scaler, resolve_precision
from ckpt_tools.train.parallel.shared_storage import (
    own_output_dir,
    require_shared_output_dir,
    same_resume_on_every_rank,
)
from ckpt_tools.train.parallel.wrap import all_reduce_ignored_grads, clip_grad_norm, parallelize
from ckpt_tools.train.policies import skip_init
from ckpt_tools.train.policies.base import PreTrainedPolicy
from ckpt_tools.train.policies.registry import make_policy
from ckpt_tools.train.policies.size import require_fits
from ckpt_tools.train.report import startup
from ckpt_tools.train.report.banner import banner_lines
from ckpt_tools.train.report.metrics import MetricsWindow
from ckpt_tools.train.report.reporting import Reporter
from ckpt_tools.train.stopping import StopRequest, TrainingStopped


def log(env: DistEnv, message: str) -> None:
    if env.is_main:
        echo(message)  # names and paths from configs and checkpoints: escaped


def make_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over loop steps: warmup then cosine to ``min_lr_ratio`` (or constant).

    The schedule advances once per loop step, as LeRobot's does; under gradient accumulation
    (or after a skipped update) that is before the first optimizer update by design, which torch
    would warn about once per rank ("Detected call of `lr_scheduler.step()` before
    `optimizer.step()`") - silenced, as it describes the intended schedule.
    """
    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before", category=UserWarning)
    warmup, total, floor = cfg.scheduler.warmup_steps, cfg.steps, cfg.scheduler.min_lr_ratio
    kind = cfg.scheduler.type

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def build_policy(
    cfg: TrainConfig, dataset: RobotDataset, resuming: bool = False, on_meta: bool = False
) -> tuple[PreTrainedPolicy, Pipeline, Pipeline]:
    """The policy (fresh, or from ``--policy.path``) and its processors, on CPU in fp32.

    ``resuming``: the checkpoint will overwrite every value, so the policy may come back on the
    meta device, uninitialized (:mod:`~ckpt_tools.train.policies.skip_init`). ``on_meta``: only
    its structure is wanted (the pre-flight): always on the meta device, no pretrained weights read.
    A config the policy's constructor refuses is one :class:`ConfigError`, not a traceback.
    """
    policy_cfg = cfg.policy
    assert policy_cfg is not None
    for name, value in (("state_dim", dataset.state_dim), ("action_dim", dataset.action_dim)):
        current = getattr(policy_cfg, name)
        if current is not None and current != value:
            raise ConfigError(f"--policy.{name}={current} does not match the dataset ({value})")
        setattr(policy_cfg, name, value)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    policy = None
    try:
        if on_meta:
            with torch.device("meta"):
                policy = make_policy(policy_cfg)
        elif skip_init.skips_init(resuming, cfg.peft is not None, bool(policy_cfg.path)):
            policy = skip_init.build_on_meta(lambda: make_policy(policy_cfg))
        if policy is None:
            policy = make_policy(policy_cfg)
    except (ValueError, TypeError, AssertionError, RuntimeError) as e:
        detail = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise ConfigError(f"--policy.type={policy_cfg.type}: cannot be built from this config ({detail})") from None
    pre, post = make_processors(dataset.stats)
    if policy_cfg.path and not on_meta:
        from ckpt_tools.train.pretrained import load_pretrained_into

        pre, post = load_pretrained_into(policy, Path(policy_cfg.path), pre, post)
    return policy, pre, post


def run_training(
    cfg: TrainConfig, env: DistEnv, resume_from: Path | None, load_source: LoadSource | None = None
) -> None:
    """``load_source``: a new run's starting parts from another checkpoint (``--checkpoint.load_from``)."""
    dp_replicate, dp_shard = cfg.validate_for_world(env.world_size)
    topology = Topology(env.world_size, dp_replicate, dp_shard, env.nnodes)
    same_resume_on_every_rank(env, resume_from)
    with own_output_dir(env, Path(str(cfg.output_dir))):
        _run_owned(cfg, env, resume_from, topology, load_source)


def _run_owned(
    cfg: TrainConfig, env: DistEnv, resume_from: Path | None, topology: Topology, load_source: LoadSource | None
) -> None:
    """The run, once this launch owns its output directory."""
    refusal = new_run_refusal(Path(str(cfg.output_dir))) if resume_from is None else None
    if refusal is not None:
        raise ConfigError(refusal)
    require_shared_output_dir(env, Path(str(cfg.output_dir)))
    state, dataset, counts = build_state(cfg, env, topology, resuming=resume_from is not None)
    startup.mark("build")
    manager = CheckpointManager(state)
    report = None
    if resume_from is not None:
        report = manager.load(resume_from)
        startup.mark("load")
    start_step = report.step if report is not None else 0
    banner = banner_lines(
        cfg, topology, state.parallel, state.precision, *counts, len(dataset), env.backend or "none", start_step
    )
    if env.distributed:
        banner.append(f"  groups      {mesh_groups(env, state.parallel.mesh).describe()}")
    for line in banner:
        log(env, line)
    for warning in state.parallel.warnings:
        log(env, f"warning: {warning}")
    if report is not None:
        position = state.sampler.position()
        log(
            env,
            f"resumed from {report.source} at step {report.step} (epoch {position.epoch}, offset {position.offset})",
        )
        for warning in report.warnings:
            log(env, f"warning: {warning}")
    elif load_source is not None:
        started = manager.initialize(load_source)
        startup.mark("load")
        log(env, f"initialized from {started.source} (step {started.step}): {','.join(started.parts)}; at step 0")
        for warning in started.warnings:
            log(env, f"warning: {warning}")
    tracker = make_tracker(cfg, env)
    train_steps(state, manager, dataset, tracker)
    if tracker is not None:
        tracker.finish()


def build_state(
    cfg: TrainConfig, env: DistEnv, topology: Topology, resuming: bool = False
) -> tuple[TrainingState, RobotDataset, tuple[int, int]]:
    """Dataset, policy (+ LoRA), layout, optimizer, scheduler, scaler and sampler, ready to train.

    Returns the state, the dataset and (parameter count, trainable count) for the banner.
    ``resuming``: a checkpoint is loaded next, so the weights may be left uninitialized (built on
    the meta device, given storage once laid out: sharded already under FSDP).
    """
    assert cfg.policy is not None
    dataset = load_dataset(
        resolve_root(cfg.dataset.root, cfg.dataset.repo_id, cfg.dataset.revision), cfg.policy.chunk_size
    )
    sized = replace(cfg.policy, state_dim=dataset.state_dim, action_dim=dataset.action_dim)  # before any allocation
    require_fits(
        sized,
        processes=env.local_world_size,
        shards=topology.dp_shard,
        peft=bool(cfg.peft),
        on_host=env.device.type == "cpu",
        batch_size=cfg.batch_size,
    )
    policy, pre, post = build_policy(cfg, dataset, resuming)
    peft_model = None
    model: torch.nn.Module = policy
    if cfg.peft is not None:
        assert cfg.policy.path is not None  # validated: PEFT adapts a saved base policy
        peft_model = model = peft_support.apply_lora(policy, cfg.peft, cfg.policy.path)
    precision = resolve_precision(cfg, topology.layout.sharded)
    if precision.mode != "no" or precision.uses_fsdp_policy:
        peft_support.upcast_trainable(model)
    on_meta = skip_init.is_on_meta(model)
    if on_meta and not topology.layout.sharded:
        skip_init.materialize(model, env.device)  # DDP broadcasts rank 0's weights: they must exist
    elif not on_meta:
        model.to(env.device)
    counts = (
        sum(p.numel() for p in policy.parameters()),
        sum(p.numel() for p in model.parameters() if p.requires_grad),
    )
    parallel = parallelize(
        model, type(policy), env, topology.dp_replicate, topology.dp_shard, cfg.accelerator.fsdp, precision
    )
    if on_meta and topology.layout.sharded:
        skip_init.materialize(parallel.inner, env.device)  # only this rank's shards are allocated
    optimizer = torch.optim.AdamW(
        [p for p in parallel.inner.parameters() if p.requires_grad], **adamw_options(cfg.run_settings())
    )
    state = TrainingState(
        cfg=cfg,
        env=env,
        parallel=parallel,
        optimizer=optimizer,
        scheduler=make_scheduler(cfg, optimizer),
        scaler=make_scaler(precision, env.device),
        sampler=GlobalOrderSampler(len(dataset), cfg.seed, cfg.batch_size, env.rank, env.world_size),
        precision=precision,
        preprocessor=pre,
        postprocessor=post,
        peft_model=peft_model,
        ema=EmaShadow(parallel.inner, schedule_of(cfg.ema)) if cfg.ema.enable else None,
    )
    # Each worker draws its own dropout masks; the same seeds give the same masks on every layout.
    torch.manual_seed(cfg.seed + 1 + env.rank)
    return state, dataset, counts


def train_steps(state: TrainingState, manager: CheckpointManager, dataset: RobotDataset, tracker: Any) -> None:
    """The loop: micro-steps, optimizer updates at window ends, logging, checkpoints, SIGTERM."""
    cfg, env = state.cfg, state.env
    save_freq = cfg.save_freq
    assert save_freq is not None, "parse_train_args fills --save_freq's default"
    params = [p for p in state.parallel.inner.parameters() if p.requires_grad]
    window = MetricsWindow(env, state.sampler.samples_per_step)
    report = Reporter(cfg, env, state.step, tracker)
    manager.on_commit = report.committed
    samples_log = SampleLog.open(cfg, env) if cfg.log_samples else None
    guard = NonFiniteGuard(env, cfg.max_nonfinite_steps)
    stop = StopRequest.install()
    first_step_of_process = True
    state.parallel.module.train()
    try:
        while state.step < cfg.steps:
            step = state.step + 1
            last_micro = step % cfg.grad_accum_steps == 0 or step == cfg.steps
            loss = float(micro_step(state, dataset, step, last_micro, samples_log).detach())
            guard.observe(loss)
            if last_micro:
                staging = manager.before_update()  # a background save's copy is taken before the update
                if staging is not None:
                    report.staging(staging)
                grad_norm, skipped = optimizer_step(state, params, guard, stop)
                if skipped is None:
                    window.grad_norm = grad_norm
                else:  # every rank: the reason was agreed
                    report.skipped(step, skipped, guard.skip_or_stop(step, skipped, lambda: last_complete(manager)))
            state.scheduler.step()  # once per loop step, whatever the number of processes
            state.step = step
            window.add(loss)
            if first_step_of_process:
                report.first_step(step)
                first_step_of_process = False
            if step % cfg.log_freq == 0 or step == cfg.steps:
                report.step(step, window.reduce(), state)
            else:
                report.tick()
            if cfg.save_checkpoint and (step % save_freq == 0 or step == cfg.steps):
                report.checkpoint(manager.save(step))
            if stop.agreed(env) and state.step < cfg.steps:
                break
        if cfg.save_checkpoint and first_step_of_process and not stop.stopping:
            final_missing = saved_step_dir(Path(str(cfg.output_dir)), state.step) is None
            if agree(env, final_missing):
                # Resumed at the final step into an output dir without that checkpoint: write
                # the restored state there, so the output dir ends with its final checkpoint
                # (with it there, the entry point said there was nothing to do and stopped).
                report.checkpoint(manager.save(state.step))
        manager.wait()  # an in-flight background save completes before the run ends
    finally:
        report.close()
        if samples_log is not None:
            samples_log.handle.close()
        stop.uninstall()
    if stop.stopping and state.step < cfg.steps:
        raise TrainingStopped(
            f"stopped by SIGTERM after step {state.step}; last complete checkpoint: {last_complete(manager)}"
        )


def last_complete(manager: CheckpointManager) -> str:
    """The checkpoint a stopped run leaves, once an in-flight background save has been committed."""
    manager.wait()
    last = layout.resolve_last(manager.root)
    return str(last) if last else "none"


def micro_step(
    state: TrainingState, dataset: RobotDataset, step: int, last_micro: bool, samples_log: SampleLog | None
) -> torch.Tensor:
    """Forward and backward of this worker's micro-batch; gradients reduced on a window's last."""
    indices = state.sampler.next_indices()
    if samples_log is not None:
        samples_log.write(step, indices)
    batch = state.preprocessor(dataset.batch(indices))
    batch = {k: v.to(state.env.device, non_blocking=True) for k, v in batch.items()}
    with state.parallel.set_gradient_sync(last_micro), state.precision.autocast(state.env.device):
        loss, _ = state.parallel.module(batch)
    scaled = loss / state.cfg.grad_accum_steps
    if state.scaler is not None:
        state.scaler.scale(scaled).backward()
    else:
        scaled.backward()
    return loss


def optimizer_step(
    state: TrainingState, params: list[torch.nn.Parameter], guard: NonFiniteGuard, stop: StopRequest | None = None
) -> tuple[float, str | None]:
    """Unscale, clip, step, zero: the end of an accumulation window.

    Returns the gradient norm, and why the update was skipped (None: it was applied). A
    skipped update leaves the weights and the optimizer state as they were.
    """
    parallel = state.parallel
    if parallel.ignored_params:
        all_reduce_ignored_grads(parallel)
    if state.scaler is not None:
        state.scaler.unscale_(state.optimizer)
    grad_norm = clip_grad_norm(params, state.cfg.optimizer.grad_clip_norm, parallel)
    skipped = guard.agree(grad_norm if state.scaler is None else None, stop)
    if skipped is not None:
        if state.scaler is not None:
            state.scaler.update()  # closes the unscale_ above; an overflow lowers the scale, as on a skip of its own
        state.optimizer.zero_grad(set_to_none=True)
        return grad_norm, skipped
    if state.scaler is not None:
        state.scaler.step(state.optimizer)
        state.scaler.update()
    else:
        state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.optimizer_steps += 1
    if state.ema is not None:
        state.ema.step()  # after each applied update, as LeRobot after each sync step
    return grad_norm, None


def agree(env: DistEnv, decision: bool) -> bool:
    """Collective: every rank takes the main rank's decision (file checks may differ per node)."""
    if not env.distributed:
        return decision
    import torch.distributed as dist

    flag = torch.tensor([int(decision)], device=env.device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


class SampleLog:
    """``<output_dir>/samples/rank<R>.jsonl``: the dataset indices each step consumed on this rank."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    @classmethod
    def open(cls, cfg: TrainConfig, env: DistEnv) -> SampleLog:
        directory = Path(str(cfg.output_dir)) / "samples"
        directory.mkdir(parents=True, exist_ok=True)
        return cls((directory / f"rank{env.rank}.jsonl").open("a", buffering=1))

    def write(self, step: int, indices: torch.Tensor) -> None:
        self.handle.write(json.dumps({"step": step, "indices": indices.tolist()}) + "\n")


def make_tracker(cfg: TrainConfig, env: DistEnv) -> Any:
    if not cfg.trackio.enable or not env.is_main:
        return None
    from ckpt_tools.train.report.tracking import TrackioTracker

    return TrackioTracker.start(cfg)
