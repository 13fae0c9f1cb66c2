"""The topology and settings a resume will run with: the saved config, overridden by flags.

``ckpt-train --resume=true --config_path=...`` starts from the checkpoint's
``train_config.json`` and lets flags override it; the start-up rules then apply to the merged
config. This module does the merge and applies the trainer's own rules
(:mod:`ckpt_tools.format.rules.startup`) to it. Each refusal is the one line the trainer would
print, plus this tool's flags for the fix.

The trainer is the one whose checkpoint it is (:func:`~ckpt_tools.format.rules.resumable.checkpoint_trainer`)
unless ``--trainer`` says otherwise. For ``lerobot-train`` (LeRobot main, which resumes the
same way from the same ``train_config.json`` fields) the rules are the mesh rules both share
and LeRobot's own (:mod:`ckpt_tools.format.rules.lerobot_resume`); ``ckpt-train``'s setting
checks (its optimizers, schedulers, ...) do not apply to LeRobot's configs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ckpt_tools.errors import UsageError
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.record import Topology, TrainingStep
from ckpt_tools.format.rules import lerobot_resume
from ckpt_tools.format.rules.resumable import Trainer
from ckpt_tools.format.rules.startup import (
    Refusal,
    RunSettings,
    mesh_value_refusal,
    resolve_parallelism,
    setting_refusals,
    world_refusals,
)
from ckpt_tools.format.train_config import SavedConfig
from ckpt_tools.io.remote import remote_file

# This tool's flag for each setting a start-up fix names.
TOOL_FLAGS = {"dp_replicate": "--dp-replicate", "dp_shard": "--dp-shard", "checkpoint_format": "--checkpoint-format"}
# The trainer's flag -> this tool's, for the settings a request overrides.
_TOOL_SPELLING = {
    "--parallelism.dp_replicate": "--dp-replicate",
    "--parallelism.dp_shard": "--dp-shard",
    "--accelerator.gradient_accumulation.steps": "--grad-accum",
    "--accelerator.mixed_precision": "--mixed-precision",
    "--checkpoint_format": "--checkpoint-format",
    "--batch_size": "--batch-size",
    "world size": "--nproc",
}


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
    trainer: str | None = None  # ckpt-train or lerobot-train (None: the checkpoint's own)
    output_dir: Path | None = None  # None: the run the checkpoint is in (the trainer's default)
    overwrite_checkpoints: bool = False

    def check(self) -> None:
        """Flag values that can never work, whatever the checkpoint: a usage error (exit 2).

        The values are judged by the trainer's own start-up rules; only the message is spelled
        with this tool's flags.
        """
        for flag, value in (("--nproc", self.nproc), ("--nnodes", self.nnodes)):
            if value is not None and value <= 0:
                raise UsageError(f"{flag}={value}: must be a positive integer")
        if self.nproc is not None and self.nnodes is not None and self.nproc % self.nnodes:
            raise UsageError(f"--nnodes={self.nnodes} does not divide --nproc={self.nproc}")
        if self.trainer is not None and self.trainer not in {t.value for t in Trainer}:
            raise UsageError(f"--trainer={self.trainer}: choose {' or '.join(t.value for t in Trainer)}")
        alone = RunSettings(
            batch_size=self.batch_size,
            grad_accum_steps=self.grad_accum,
            mixed_precision=self.mixed_precision,
            checkpoint_format=self.checkpoint_format,
        )
        refusals = setting_refusals(alone)
        mesh = mesh_value_refusal(self.dp_replicate, self.dp_shard)
        if mesh is None and self.nproc is not None and self.dp_replicate is not None and self.dp_shard is not None:
            _, mesh = resolve_parallelism(self.dp_replicate, self.dp_shard, self.nproc)
        if mesh is not None:
            refusals.insert(0, mesh)
        if refusals:
            raise UsageError(_tool_spelling(refusals[0].reason))


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
    trainer: Trainer = Trainer.CKPT_TRAIN  # who resumes
    kind_refusal: str | None = None  # lerobot-train: the topology resolves, but LeRobot refuses to resume onto it
    output_dir: Path | None = None  # where the resumed run writes (None: unknown - no train_config.json)
    overwrite_checkpoints: bool = False
    settings: RunSettings | None = None  # the merged settings (None: no train_config.json)

    @property
    def sharded(self) -> bool:
        return self.topology is not None and self.topology.layout.sharded


def _pick(flag: object, saved: object, recorded: object) -> object:
    return flag if flag is not None else saved if saved is not None else recorded


def resolve_target(
    config: SavedConfig | None,
    record: TrainingStep,
    request: TargetRequest,
    *,
    paths: StepPaths | None = None,
    trainer: Trainer = Trainer.CKPT_TRAIN,
) -> ResumeTarget:
    """Merge the request over ``config`` (falling back to ``record``) and apply the start-up rules.

    ``trainer``: whose checkpoint it is (``request.trainer`` overrides it); ``paths``: where it is
    (for LeRobot's refusals, which name its files).
    """
    trainer = Trainer(request.trainer) if request.trainer else trainer
    saved_world = record.topology.world_size if record.topology else record.legacy_num_processes or 1
    world = request.nproc or saved_world
    cfg_r = config.dp_replicate if config else None
    cfg_s = config.dp_shard if config else None
    rec_r = record.topology.dp_replicate if record.topology else 1
    rec_s = record.topology.dp_shard if record.topology else 1
    if trainer is Trainer.LEROBOT and config is not None:
        # LeRobot parses the saved config into its own: one without a parallelism group (0.6.x)
        # resumes with LeRobot's defaults, 1×1 (DDP filled in on several processes).
        rec_r, rec_s = 1, 1
    r = int(_pick(request.dp_replicate, cfg_r, rec_r))  # type: ignore[call-overload]
    s = int(_pick(request.dp_shard, cfg_s, rec_s))  # type: ignore[call-overload]
    batch = _pick(request.batch_size, config.batch_size if config else None, record.batch_size)
    accum = _pick(request.grad_accum, config.grad_accum_steps if config else None, record.grad_accum_steps)
    precision = _pick(request.mixed_precision, config.mixed_precision if config else None, record.mixed_precision)
    fmt = _pick(request.checkpoint_format, config.checkpoint_format if config else None, record.checkpoint_format)
    saved = config.run_settings() if config is not None else RunSettings()
    settings = replace(
        saved,
        dp_replicate=r,
        dp_shard=s,
        batch_size=batch,  # type: ignore[arg-type]
        grad_accum_steps=accum,  # type: ignore[arg-type]
        mixed_precision=precision,  # type: ignore[arg-type]
        checkpoint_format=fmt,  # type: ignore[arg-type]
    )
    mesh, refusals = world_refusals(settings, world)
    topology = None
    if mesh is not None:
        topology = Topology(world, *mesh, request.nnodes or _same_nodes(record, world))
    kind = None
    if trainer is Trainer.LEROBOT:
        # LeRobot's own start-up rules, not ckpt-train's (which know only ckpt-train's optimizers, policies, ...).
        problems = [_with_tool_flags(refusal) for refusal in refusals]
        if topology is not None:
            peft = config is not None and config.peft
            problems += lerobot_resume.setting_refusals(topology, mixed_precision=precision, peft=peft)  # type: ignore[arg-type]
            if paths is not None:
                kind = lerobot_resume.kind_refusal(paths, record, topology)
    else:
        problems = [_with_tool_flags(refusal) for refusal in refusals + setting_refusals(settings)]
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
        trainer=trainer,
        kind_refusal=kind,
        output_dir=Path(request.output_dir) if request.output_dir else _default_output_dir(config),
        overwrite_checkpoints=request.overwrite_checkpoints,
        settings=settings if config is not None else None,
    )


def _same_nodes(record: TrainingStep, world: int) -> int | None:
    """Keep the recorded node count only when the world size did not change."""
    if record.topology is not None and record.topology.world_size == world:
        return record.topology.nnodes
    return None


def _tool_spelling(line: str) -> str:
    for trainer, tool in _TOOL_SPELLING.items():
        line = line.replace(trainer, tool)
    return line.replace(" (processes launched)", "")


def _with_tool_flags(refusal: Refusal) -> str:
    """The trainer's line, then the same fix in this tool's flags."""
    if not refusal.fixes:
        return refusal.message
    return f"{refusal.message} (here: {' or '.join(fix.spell(TOOL_FLAGS, ' ') for fix in refusal.fixes)})"


def _default_output_dir(config: SavedConfig | None) -> Path | None:
    """Where the resume writes when not told: the checkpoint's own run; unknown for one on the Hub (never written to)."""
    run = config.run_dir if config is not None else None
    return None if run is None or remote_file(run) is not None else run
