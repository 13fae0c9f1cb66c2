"""The training configuration: dataclasses whose fields are the dotted flags of ``ckpt-train``.

``--group.field=value`` maps onto these dataclasses through draccus. Static validation
happens in ``validate`` (start-up, before any process group exists) and topology-dependent
validation in ``validate_for_world``; both raise :class:`ConfigError` with the first refusal
of the start-up rules (:mod:`ckpt_tools.format.rules.startup`, which ``reshard-plan`` and
``verify-resume`` apply too). The saved ``train_config.json`` is exactly the object that ran
(dataset-derived sizes filled in), and ``--resume`` reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import draccus

from ckpt_tools.errors import ConfigError, UsageError
from ckpt_tools.format.layout import TRAIN_CONFIG, CheckpointFormat
from ckpt_tools.format.rules.startup import (
    RunSettings,
    default_save_freq,
    default_save_freq_note,
    setting_refusals,
    world_refusals,
)
from ckpt_tools.format.train_config import SavedConfig, absolute_path
from ckpt_tools.train.policies.configs import PolicyConfig


@dataclass
class DatasetConfig:
    repo_id: str | None = None
    root: str | None = None
    revision: str | None = None


@dataclass
class OptimizerConfig:
    type: str = "adamw"
    lr: float = 1e-4
    weight_decay: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip_norm: float = 10.0  # 0 disables clipping


@dataclass
class SchedulerConfig:
    type: str = "cosine"  # cosine (with warmup) | constant
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1


@dataclass
class ParallelismConfig:
    dp_replicate: int = 1
    dp_shard: int = 1  # -1: shard over all launched processes (divided by dp_replicate)


@dataclass
class MixedPrecisionPolicyConfig:
    """FSDP2 ``MixedPrecisionPolicy`` fields; once any is set the policy uses these alone."""

    param_dtype: str | None = None
    reduce_dtype: str | None = None
    output_dtype: str | None = None
    cast_forward_inputs: bool | None = None

    @property
    def any_set(self) -> bool:
        return any(
            v is not None for v in (self.param_dtype, self.reduce_dtype, self.output_dtype, self.cast_forward_inputs)
        )


@dataclass
class FSDPConfig:
    wrap_modules: list[str] | None = None
    min_num_params: int | None = None
    reshard_after_forward: bool = True
    cpu_offload: bool = False
    ignored_modules: str | None = None  # regex over module paths (PEFT: base_model.model.…)
    mixed_precision_policy: MixedPrecisionPolicyConfig = field(default_factory=MixedPrecisionPolicyConfig)


@dataclass
class GradientAccumulationConfig:
    steps: int = 1


@dataclass
class AcceleratorConfig:
    mixed_precision: str = "no"
    gradient_accumulation: GradientAccumulationConfig = field(default_factory=GradientAccumulationConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class PeftConfig:
    method_type: str = "LORA"
    r: int = 16
    lora_alpha: int | None = None  # defaults to r
    lora_dropout: float = 0.0
    target_modules: list[str] | None = None  # defaults to the policy's linear layers
    full_training_modules: list[str] | None = None


@dataclass
class EMAConfig:
    """LeRobot main's ``--ema.*`` flags (``EMAConfig``): an exponential moving average of the weights.

    ``use_for_eval`` is kept for LeRobot's spelling (this trainer runs no evaluation). The
    schedule and its checks are :mod:`ckpt_tools.format.ema`'s.
    """

    enable: bool = False
    decay: float | None = None  # constant decay at every step; None: the warmup schedule below
    update_after_step: int = 0  # optimizer updates during which the shadow stays a copy of the weights
    inv_gamma: float = 1.0
    power: float = 0.75
    min_decay: float = 0.0
    max_decay: float = 0.9999
    use_for_eval: bool = True


@dataclass
class TrackioConfig:
    enable: bool = False
    project: str | None = None


@dataclass
class CheckpointConfig:
    """How the run keeps its checkpoints, and what a new run starts from (``--checkpoint.<field>``)."""

    # Keep the newest N step directories; each save removes older ones once it is committed
    # (never `last`, the newest resumable step, or a step a reader holds). None: keep all.
    keep_last_n: int | None = None
    # `last`: auto = a symlink, a pointer file where the file system refuses symlinks;
    # file = always the pointer file (for stores that mangle symlinks).
    last_link: str = "auto"
    # Start this new run (step 0, its own --output_dir) from a checkpoint's parts: a step dir,
    # `last`, a checkpoints/ dir or a run's output dir (its `last`).
    load_from: str | None = None
    # The parts to load, a comma list of model, optimizer, scheduler, scaler, rng, or all (a
    # resume's set); None: model (weights only). The rest start fresh.
    load: str | None = None


@dataclass
class TrainConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    policy: PolicyConfig | None = None
    output_dir: str | None = None
    job_name: str | None = None
    seed: int = 1000
    steps: int = 100
    batch_size: int = 8
    # Loop steps between checkpoints (the final step is always saved). None: DEFAULT_SAVE_FREQ,
    # rounded up to a multiple of the accumulation steps (fill_defaults; the saved config holds the number).
    save_freq: int | None = None
    save_checkpoint: bool = True
    log_freq: int = 10
    checkpoint_format: str = CheckpointFormat.SAFETENSORS.value
    # Stage the state to host memory and write the checkpoint in the background while the
    # loop goes on (at most one save in flight; the same atomic commit and `last` rule).
    checkpoint_async: bool = False
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: bool = False
    # A resume refuses to start when the output dir holds checkpoints after the step it resumes
    # from (it would save over them); true replaces them. Never carried over by a resume.
    overwrite_checkpoints: bool = False
    progress_bar: bool = True
    # How long a rank waits in a collective for the others: a rank that dies or stalls (a
    # wedged process, a lost node) ends the job with an error after this, instead of a hang.
    collective_timeout_s: float = 600.0
    # Audit trail of data order: each rank appends the dataset indices it consumes per step
    # to <output_dir>/samples/rank<R>.jsonl.
    log_samples: bool = False
    # How many optimizer updates a run may skip because the loss (or, without a loss scaler,
    # the gradient norm) is NaN or infinite; the next one stops it. 0: stop at the first.
    max_nonfinite_steps: int = 0
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    accelerator: AcceleratorConfig = field(default_factory=AcceleratorConfig)
    peft: PeftConfig | None = None
    trackio: TrackioConfig = field(default_factory=TrackioConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)

    @property
    def grad_accum_steps(self) -> int:
        return self.accelerator.gradient_accumulation.steps

    @property
    def format(self) -> CheckpointFormat:
        return CheckpointFormat(self.checkpoint_format)

    def run_settings(self) -> RunSettings:
        """What the start-up rules check, read off this config as ``train_config.json`` saves it.

        The tools read the saved file the same way, so trainer and tools check the same values.
        """
        return SavedConfig(Path(TRAIN_CONFIG), draccus.encode(self)).run_settings()

    def record_absolute_paths(self) -> None:
        """Make the local paths absolute (flags are relative to the current directory).

        ``train_config.json`` then means the same wherever it is read from: a resume, or a tool
        run from another directory, finds the same dataset and policy (docs/checkpoint-format.md).
        """
        if self.output_dir:
            self.output_dir = absolute_path(self.output_dir)
        if self.dataset.root:
            self.dataset.root = absolute_path(self.dataset.root)
        if self.checkpoint.load_from:
            self.checkpoint.load_from = absolute_path(self.checkpoint.load_from)
        if self.policy is not None and self.policy.path and Path(self.policy.path).expanduser().exists():
            self.policy.path = absolute_path(self.policy.path)

    def fill_defaults(self) -> list[str]:
        """Fill the defaults that depend on other flags; return what the start-up says about them.

        Done before the config is checked and saved, so ``train_config.json`` (and a resume) holds
        the value that ran.
        """
        notes = []
        if self.save_freq is None:
            self.save_freq = default_save_freq(self.grad_accum_steps)
            note = default_save_freq_note(self.grad_accum_steps)
            if note is not None:
                notes.append(note)
        return notes

    def validate(self) -> None:
        """Checks that need no process group: every message names its flag."""
        if self.policy is None:
            raise ConfigError("--policy.type (or --policy.path) is required")
        if not self.output_dir:
            raise ConfigError("--output_dir is required")
        output = Path(str(self.output_dir))
        try:
            blocked = next((p for p in (output, *output.parents) if p.exists() and not p.is_dir()), None)
        except OSError as e:  # a name longer than the file system allows, a loop of links
            raise ConfigError(f"--output_dir={output}: {e.strerror or e}") from None
        if blocked is not None:
            raise ConfigError(f"--output_dir={output}: {blocked} exists and is not a directory")
        refusals = setting_refusals(self.run_settings())
        if refusals:
            raise ConfigError(refusals[0].message)
        from ckpt_tools.train.policies.size import check_sizes

        check_sizes(self.policy)  # a policy that cannot be built; whether it fits is known once the dataset is
        from ckpt_tools.hub import check_repo_id

        # Hub ids are checked here, before any process group: `${HF_USER}/my_dataset` with
        # HF_USER unset is `/my_dataset`, which huggingface_hub would reject with a traceback.
        for flag, repo_id in (("--dataset.repo_id", self.dataset.repo_id), ("--policy.repo_id", self.policy.repo_id)):
            if repo_id is not None:
                try:
                    check_repo_id(repo_id, flag=flag)
                except UsageError as e:
                    raise ConfigError(str(e)) from None

    def validate_for_world(self, world_size: int) -> tuple[int, int]:
        """(dp_replicate, dp_shard) for a launch of ``world_size`` processes, or the first refusal."""
        mesh, refusals = world_refusals(self.run_settings(), world_size)
        if refusals:
            raise ConfigError(refusals[0].message)
        assert mesh is not None
        return mesh


def train_config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as ``train_config.json`` holds it (and the experiment tracker records it)."""
    encoded = draccus.encode(cfg)
    assert isinstance(encoded, dict)
    return encoded
