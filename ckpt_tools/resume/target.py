"""The topology and settings a resume will run with: the saved config, overridden by flags.

``ckpt-train --resume=true --config_path=...`` starts from the checkpoint's
``train_config.json`` and lets flags override it; the start-up checks then apply to the merged
config. The tools predict that outcome, so this module mirrors the training core's rules
(``TrainConfig.resolve_parallelism``, ``validate_for_world`` and the parts of ``validate`` a
resume can trip) without importing it - the training core needs torch. Each refusal is the
one line the training core would print, plus the tool flag that changes the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ckpt_tools.errors import UsageError
from ckpt_tools.format.layout import CheckpointFormat
from ckpt_tools.format.record import Topology, TrainingStep
from ckpt_tools.format.train_config import SavedConfig

MIXED_PRECISION_CHOICES = ("no", "bf16", "fp16")


@dataclass(frozen=True)
class TargetRequest:
    """What the resume command overrides; None keeps the saved config's value."""

    nproc: int | None = None
    dp_replicate: int | None = None
    dp_shard: int | None = None
    batch_size: int | None = None
    grad_accum: int | None = None
    mixed_precision: str | None = None
    checkpoint_format: str | None = None
    nnodes: int | None = None

    def check(self) -> None:
        """Flag values that can never work, whatever the checkpoint: a usage error (exit 2)."""
        for flag, value in (
            ("--nproc", self.nproc),
            ("--batch-size", self.batch_size),
            ("--grad-accum", self.grad_accum),
            ("--nnodes", self.nnodes),
            ("--dp-replicate", self.dp_replicate),
        ):
            if value is not None and value <= 0:
                raise UsageError(f"{flag}={value}: must be a positive integer")
        if self.dp_shard is not None and self.dp_shard <= 0 and self.dp_shard != -1:
            raise UsageError(f"--dp-shard={self.dp_shard}: must be ≥ 1 or -1 (all processes)")
        if self.mixed_precision is not None and self.mixed_precision not in MIXED_PRECISION_CHOICES:
            raise UsageError(f"--mixed-precision={self.mixed_precision}: choose no, bf16 or fp16")
        if self.checkpoint_format is not None and self.checkpoint_format not in {f.value for f in CheckpointFormat}:
            raise UsageError(
                f"--checkpoint-format={self.checkpoint_format}: choose safetensors, dcp or safetensors_dcp"
            )
        if self.nproc is not None and self.nnodes is not None and self.nproc % self.nnodes:
            raise UsageError(f"--nnodes={self.nnodes} does not divide --nproc={self.nproc}")
        r, s = self.dp_replicate, self.dp_shard
        if self.nproc is not None and r is not None and s is not None and s != -1 and r * s not in (1, self.nproc):
            raise UsageError(f"--dp-replicate × --dp-shard = {r}×{s} = {r * s} ≠ --nproc {self.nproc}")


@dataclass(frozen=True)
class ResumeTarget:
    """The resumed run as the training core will set it up (``topology`` None: it refuses to)."""

    world_size: int
    topology: Topology | None
    batch_size: int | None
    grad_accum_steps: int | None
    mixed_precision: str | None
    checkpoint_format: str | None
    problems: tuple[str, ...] = ()  # start-up refusals, one line each
    overridden: tuple[str, ...] = field(default_factory=tuple)  # fields the request changed

    @property
    def sharded(self) -> bool:
        return self.topology is not None and self.topology.layout.sharded


def _pick(flag: object, saved: object, recorded: object) -> object:
    return flag if flag is not None else saved if saved is not None else recorded


def resolve_target(config: SavedConfig | None, record: TrainingStep, request: TargetRequest) -> ResumeTarget:
    """Merge the request over ``config`` (falling back to ``record``) and apply the start-up rules."""
    saved_world = record.topology.world_size if record.topology else record.legacy_num_processes or 1
    world = request.nproc or saved_world
    cfg_r = config.dp_replicate if config else None
    cfg_s = config.dp_shard if config else None
    rec_r = record.topology.dp_replicate if record.topology else 1
    rec_s = record.topology.dp_shard if record.topology else 1
    r = int(_pick(request.dp_replicate, cfg_r, rec_r))  # type: ignore[call-overload]
    s = int(_pick(request.dp_shard, cfg_s, rec_s))  # type: ignore[call-overload]
    batch = _pick(request.batch_size, config.batch_size if config else None, record.batch_size)
    accum = _pick(request.grad_accum, config.grad_accum_steps if config else None, record.grad_accum_steps)
    precision = _pick(request.mixed_precision, config.mixed_precision if config else None, record.mixed_precision)
    fmt = _pick(request.checkpoint_format, config.checkpoint_format if config else None, record.checkpoint_format)
    problems: list[str] = []
    resolved = resolve_parallelism(r, s, world, problems)
    topology = None
    if resolved is not None:
        topology = Topology(world, resolved[0], resolved[1], request.nnodes or _same_nodes(record, world))
        _validate_for_world(topology, fmt, config, problems)  # type: ignore[arg-type]
    _validate(batch, accum, precision, fmt, config, problems)  # type: ignore[arg-type]
    overridden = tuple(
        name
        for name, value in (
            ("nproc", request.nproc),
            ("dp_replicate", request.dp_replicate),
            ("dp_shard", request.dp_shard),
            ("batch_size", request.batch_size),
            ("grad_accum", request.grad_accum),
            ("mixed_precision", request.mixed_precision),
            ("checkpoint_format", request.checkpoint_format),
        )
        if value is not None
    )
    return ResumeTarget(
        world_size=world,
        topology=topology,
        batch_size=batch,  # type: ignore[arg-type]
        grad_accum_steps=accum,  # type: ignore[arg-type]
        mixed_precision=precision,  # type: ignore[arg-type]
        checkpoint_format=fmt,  # type: ignore[arg-type]
        problems=tuple(problems),
        overridden=overridden,
    )


def _same_nodes(record: TrainingStep, world: int) -> int | None:
    """Keep the recorded node count only when the world size did not change."""
    if record.topology is not None and record.topology.world_size == world:
        return record.topology.nnodes
    return None


def resolve_parallelism(r: int, s: int, world: int, problems: list[str]) -> tuple[int, int] | None:
    """``TrainConfig.resolve_parallelism``: (dp_replicate, dp_shard), or None with the refusal."""
    if r <= 0:
        problems.append(f"--parallelism.dp_replicate={r}: must be ≥ 1")
        return None
    if s == -1:
        if world % r:
            problems.append(
                f"--parallelism.dp_shard=-1 with --parallelism.dp_replicate={r}: world size {world} is not divisible by {r}"
            )
            return None
        s = world // r
    elif s <= 0:
        problems.append(f"--parallelism.dp_shard={s}: must be ≥ 1 or -1 (all launched processes)")
        return None
    if r * s == 1 and world > 1:
        return world, 1  # a plain multi-process launch is DDP over every process
    if r * s != world:
        problems.append(
            f"--parallelism.dp_replicate × --parallelism.dp_shard = {r}×{s} = {r * s} ≠ world size {world}"
            f" (processes launched): {_fitting(world)}"
        )
        return None
    return r, s


def _fitting(world: int) -> str:
    """How to say the parallelism of ``world`` processes, as resume flags and as this tool's flags."""
    if world == 1:
        return "resume with --parallelism.dp_replicate=1 --parallelism.dp_shard=1 (here: --dp-replicate 1 --dp-shard 1)"
    return (
        f"resume with --parallelism.dp_replicate=1 --parallelism.dp_shard={world} for FSDP, or dp_shard=1 for DDP"
        f" (here: --dp-replicate 1 --dp-shard {world} or --dp-shard 1)"
    )


def _validate_for_world(topology: Topology, fmt: str | None, config: SavedConfig | None, problems: list[str]) -> None:
    if topology.layout.sharded:
        return
    if fmt not in (None, CheckpointFormat.SAFETENSORS.value):
        problems.append(
            f"--checkpoint_format={fmt}: DCP shards need a sharded run (--parallelism.dp_shard > 1);"
            " resume with --checkpoint_format=safetensors (here: --checkpoint-format safetensors)"
        )
    if config is not None and config.mixed_precision_policy:
        problems.append(
            "--accelerator.fsdp.mixed_precision_policy.* applies to sharded runs only: the saved config sets it,"
            " so this non-sharded target is refused (override those fields, or keep a sharded layout)"
        )


def _validate(
    batch: int | None,
    accum: int | None,
    precision: str | None,
    fmt: str | None,
    config: SavedConfig | None,
    problems: list[str],
) -> None:
    if batch is not None and batch <= 0:
        problems.append(f"--batch_size={batch}: must be a positive integer")
    if accum is not None and accum <= 0:
        problems.append(f"--accelerator.gradient_accumulation.steps={accum}: must be ≥ 1")
    save_freq = config.save_freq if config else None
    if accum and accum > 0 and save_freq and save_freq % accum:
        problems.append(
            f"--save_freq={save_freq}: must be a multiple of --accelerator.gradient_accumulation.steps={accum}"
            " (a checkpoint must not fall inside an accumulation window)"
        )
    if precision is not None and precision not in MIXED_PRECISION_CHOICES:
        problems.append(f"--accelerator.mixed_precision={precision}: choose no, bf16 or fp16")
    if fmt is not None and fmt not in {f.value for f in CheckpointFormat}:
        problems.append(f"--checkpoint_format={fmt}: choose one of safetensors, dcp, safetensors_dcp")
    policy = config.mixed_precision_policy if config else {}
    uses_fp16 = "float16" in (policy.get("param_dtype"), policy.get("reduce_dtype"), policy.get("output_dtype"))
    if uses_fp16 and precision != "fp16":
        problems.append(
            "--accelerator.fsdp.mixed_precision_policy.*=float16 needs --accelerator.mixed_precision=fp16"
            " (it builds the loss scaler)"
        )
