"""The load half of the checkpoint life cycle: restore a step dir onto the running topology.

The load reshards: DCP shards load onto whatever topology is running now, and the flat files
of non-sharded runs load into sharded ones. Which container each state comes from is the
manifest's choice (:func:`~ckpt_tools.format.manifest.choose`: DCP shards, else the one-file
form), the same function ``verify-resume`` and ``reshard-plan`` predict it with; which other
state files it reads is the manifest's :class:`~ckpt_tools.format.manifest.Resume` rule. Each
part is read by its pair in :mod:`ckpt_tools.train.checkpoint.parts`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from ckpt_tools.errors import CheckpointError, CkptError
from ckpt_tools.facts import consistency, load_plan, save_files, saved_hyperparameters
from ckpt_tools.facts import load_parts as load_sources
from ckpt_tools.facts.record import read_record
from ckpt_tools.format import ema as ema_rules
from ckpt_tools.format import layout, manifest
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.record import TrainingStep
from ckpt_tools.format.rules import load_parts
from ckpt_tools.format.rules.data_order import DataOrderChange
from ckpt_tools.format.rules.startup import RunSettings
from ckpt_tools.train.checkpoint import parts, rng, state_dicts
from ckpt_tools.train.checkpoint.audit import resident_bytes, write_audit
from ckpt_tools.train.checkpoint.safe_dcp import require_valid_dcp_inputs
from ckpt_tools.train.checkpoint.training_state import TrainingState
from ckpt_tools.train.parallel.distributed import DistEnv


@dataclass
class ResumeReport:
    step: int
    source: Path
    record: TrainingStep
    sample_exact: bool
    rng_restored: bool
    warnings: list[str] = field(default_factory=list)


@dataclass
class InitReport:
    """What a new run took from another run's checkpoint (``--checkpoint.load_from``)."""

    source: Path
    step: int
    parts: tuple[str, ...]
    initialized_from: dict[str, object]
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LoadSource:
    """The checkpoint a new run starts from, its record, and the parts it takes."""

    paths: StepPaths
    record: TrainingStep
    parts: tuple[str, ...]


def preflight_load_source(load_from: str, load: str | None, settings: RunSettings, fp16: bool) -> LoadSource:
    """Before any process group exists: can this checkpoint give the parts chosen (the rule
    ``verify-resume --load`` applies)? One :class:`CheckpointError` line when not.

    The parts not chosen are not read, nor judged: a damaged optimizer file does not stop a
    weights-only start.
    """
    try:
        paths = layout.resolve_step(load_from)
    except CheckpointError as e:
        raise CheckpointError(f"{load_parts.LOAD_FROM_FLAG}={e}") from None
    record = read_record(paths)
    chosen_parts = load_parts.parse(load)
    line = load_sources.source_refusal(paths, record, chosen_parts, fp16=fp16, settings=settings)
    if line is not None:
        raise CheckpointError(line)
    return LoadSource(paths, record, chosen_parts)


def initialize_from(s: TrainingState, source: LoadSource) -> InitReport:
    """Collective: load the chosen parts of ``source`` into a new run at step 0; the rest stay fresh.

    The same part loaders a resume uses (so the same resharding onto any topology); the data
    position, the step and the counters stay the new run's. Failures end as one
    :class:`CheckpointError` naming the directory, as a resume's do.
    """
    try:
        return _initialize(s, source)
    except CkptError:
        raise
    except Exception as e:
        detail = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise CheckpointError(
            f"{source.paths.root}: cannot load {','.join(source.parts)} from it ({type(e).__name__}: {detail})"
        ) from None


def _initialize(s: TrainingState, source: LoadSource) -> InitReport:
    paths, record, wanted = source.paths, source.record, source.parts
    fp16 = s.cfg.accelerator.mixed_precision == "fp16"
    chosen = tuple(c for part in wanted for c in manifest.part_containers(part, fp16=fp16))
    require_valid_dcp_inputs(paths, only=chosen)  # before torch's DCP load touches a byte
    line = load_sources.source_refusal(paths, record, wanted, fp16=fp16, settings=s.cfg.run_settings())
    if line is not None:  # as the start-up found (or not): each load refuses on its own too
        raise CheckpointError(line)
    warnings: list[str] = []
    reads: dict[str, int] = {}
    if load_parts.MODEL in wanted:
        reads.update(_load_weights(s, paths, None, warnings))
    if load_parts.OPTIMIZER in wanted:
        own = [{k: v for k, v in group.items() if k != "params"} for group in s.optimizer.param_groups]
        reads.update(_load_optimizer(s, paths, record))
        if load_parts.SCHEDULER not in wanted:  # the moments go on under this run's lr, betas, eps, decay
            for group, settings in zip(s.optimizer.param_groups, own, strict=True):
                group.update(settings)
    _write_audit(s, paths, reads)
    if load_parts.SCHEDULER in wanted:
        parts.load_scheduler_state(s.scheduler, paths)
    if load_parts.SCALER in wanted and fp16:
        parts.load_scaler_state(s.scaler, paths)
    if load_parts.RNG in wanted:
        same_world = record.topology is not None and record.topology.world_size == s.env.world_size
        if same_world:
            parts.load_rng_state(paths, s.env)
        else:
            warnings.append("random generator state not loaded (world size changed): the new run's seeds stand")
    initialized = load_sources.initialized_from(paths, record, wanted)
    s.initialized_from = initialized
    return InitReport(paths.root, record.step, wanted, initialized, warnings)


def load_checkpoint(state: TrainingState, step_dir: Path, trainable: set[str] | None) -> ResumeReport:
    """Collective: restore everything from ``step_dir`` onto the current topology.

    ``trainable``: the parameters a PEFT run trains (the only ones its checkpoint holds), or
    None for a whole model. A checkpoint is input from outside: whatever in it makes the
    restore fail (a JSON value of the wrong type that a ``load_state_dict`` chokes on, a tensor
    of the wrong shape) ends as one :class:`CheckpointError` naming the directory, not a traceback.
    """
    try:
        return _load(state, StepPaths(step_dir), trainable)
    except CkptError:
        raise
    except Exception as e:
        detail = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise CheckpointError(f"{step_dir}: cannot resume from it ({type(e).__name__}: {detail})") from None


def preflight_resume(step_dir: Path) -> TrainingStep:
    """Before any process group exists: is this a checkpoint we can resume at all, its parts from one step?

    The ends of the bulk files (shards) are not read here, by every rank: :func:`_load` shares them out.
    """
    paths = StepPaths(step_dir)
    record = parts.load_training_step(paths)
    require_consistent(paths, record, bulk_share=None)
    return record


def require_consistent(
    paths: StepPaths, record: TrainingStep, bulk_share: tuple[int, int] | None = save_files.ALL
) -> None:
    """Refuse a checkpoint whose files are not its save's, or whose parts are not from one step
    (the rules ``verify-resume`` checks too)."""
    reason = save_files.mismatch(paths, bulk_share) or consistency.inconsistency(paths, record)
    if reason is not None:
        raise CheckpointError(reason)


def require_saved_settings(paths: StepPaths, settings: RunSettings) -> None:
    """Refuse saved optimizer / scheduler values the resumed config would not run with (torch's
    loads would apply them silently; the line ``verify-resume`` gives)."""
    line = saved_hyperparameters.mismatch(paths, settings)
    if line is not None:
        raise CheckpointError(line)


def require_bulk_from_save(env: DistEnv, paths: StepPaths) -> None:
    """Collective: the bulk files' ends against the record, each file read by one rank; every rank
    refuses with the first line any rank found (the line ``verify-resume`` gives when it is the only one)."""
    share = (env.rank, env.world_size) if env.distributed else save_files.ALL
    line = save_files.mismatch(paths, share)
    if env.distributed:
        lines: list[str | None] = [None] * env.world_size
        dist.all_gather_object(lines, line)
        line = next((found for found in lines if found is not None), None)
    if line is not None:
        raise CheckpointError(line)


def _load(s: TrainingState, paths: StepPaths, trainable: set[str] | None) -> ResumeReport:
    record = parts.load_training_step(paths)
    require_valid_dcp_inputs(paths)  # before torch's DCP load touches a byte
    require_consistent(paths, record, bulk_share=None)  # as the preflight did: the load refuses on its own too
    require_saved_settings(paths, s.cfg.run_settings())
    refusal = ema_rules.resume_refusal(paths, record, s.cfg.ema.enable)
    if refusal is not None:
        raise CheckpointError(refusal)
    require_bulk_from_save(s.env, paths)
    warnings: list[str] = []
    reads = _load_weights(s, paths, trainable, warnings)
    reads.update(_load_optimizer(s, paths, record))
    if s.ema is not None:
        reads.update(parts.load_ema(s.ema, s.parallel, paths, record))
    _write_audit(s, paths, reads)
    resume = manifest.Resume.of(record, s.env.world_size, s.cfg.accelerator.mixed_precision)
    parts.load_scheduler_state(s.scheduler, paths)
    if resume.fp16:
        parts.load_scaler_state(s.scaler, paths)
    if resume.same_world:
        parts.load_rng_state(paths, s.env)
    else:
        rng.reseed(s.env, s.cfg.seed, record.step)
    assert record.samples_seen is not None
    s.sampler.restore(record.samples_seen)
    s.step = record.step
    s.optimizer_steps = record.optimizer_steps or 0
    s.initialized_from = record.initialized_from  # a run started from another's parts says so to its end
    order = DataOrderChange(record.dp_world_size, record.batch_size, s.sampler.world_size, s.cfg.batch_size)
    sample_exact = order.sample_exact is True
    if not sample_exact:
        warnings.append(f"data order is {order.describe()}")
    if not resume.same_world:
        warnings.append("random generator state not restored (world size changed): dropout masks differ")
    return ResumeReport(record.step, paths.root, record, sample_exact, resume.same_world, warnings)


def _load_weights(
    s: TrainingState, paths: StepPaths, trainable: set[str] | None, warnings: list[str]
) -> dict[str, int]:
    """The weights from the container the manifest chooses; returns the DCP bytes read per file.

    A gathered file whose dtypes are not the live parameters' (not bit-exact) adds to ``warnings``.
    """
    peft = trainable is not None
    chosen = manifest.choose(manifest.weights_inputs(peft), paths)
    if chosen is None:
        raise CheckpointError(manifest.no_weights_reason(paths, peft))
    if not peft:  # the pre-flight's comparison, before torch's load stops on it with its own words
        expected = {name: tuple(t.shape) for name, t in state_dicts.sharded_model_state(s.parallel, None).items()}
        line = load_plan.mismatch(paths, expected)
        if line is not None:
            raise CheckpointError(line)
    if chosen is manifest.MODEL_DCP:
        return parts.load_model_dcp(s.parallel, paths, trainable)
    cast = parts.load_gathered_weights(s.parallel, paths.root / chosen.path, trainable)
    if cast is not None:
        warnings.append(cast)
    return {}


def _load_optimizer(s: TrainingState, paths: StepPaths, record: TrainingStep) -> dict[str, int]:
    """The optimizer state from the container the manifest chooses; returns the DCP bytes read per file."""
    chosen = manifest.choose(manifest.optimizer_inputs(), paths)
    if chosen is None:
        raise CheckpointError(manifest.no_optimizer_reason(paths, bool(record.sharded)))
    if chosen is manifest.OPTIMIZER_DCP:
        return parts.load_optimizer_dcp(s.parallel, s.optimizer, paths)
    parts.load_flat_optimizer(s.parallel, s.optimizer, paths)
    return {}


def _write_audit(s: TrainingState, paths: StepPaths, reads: dict[str, int]) -> None:
    """``resume_audit/rank<R>.json``: what this rank read and now holds (``reshard-plan``'s measured side)."""
    payload = {
        "rank": s.env.rank,
        "world_size": s.env.world_size,
        "dp_replicate": s.parallel.dp_replicate,
        "dp_shard": s.parallel.dp_shard,
        "source": str(paths.root),
        "read": dict(sorted(reads.items())),
        "resident": resident_bytes(s.parallel.inner, s.optimizer),
    }
    write_audit(Path(str(s.cfg.output_dir)) / "resume_audit" / f"rank{s.env.rank}.json", payload)
