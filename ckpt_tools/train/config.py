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
from ckpt_tools.format.layout import CheckpointFormat
from ckpt_tools.format.rules.run_settings import RunSettings, read_run_settings
from ckpt_tools.format.rules.startup import (
    DEFAULT_SAVE_FREQ,
    default_save_freq,
    default_save_freq_note,
    setting_refusals,
    world_refusals,
)
from ckpt_tools.format.train_config import absolute_path, top_level_mismatch
from ckpt_tools.train.flag import flag
from ckpt_tools.train.policies.configs import PolicyConfig


@dataclass
class DatasetConfig:
    repo_id: str | None = flag(
        None,
        help=(
            "A Hub dataset (user/name), resolved through the Hugging Face cache (works offline with "
            "HF_HUB_OFFLINE=1 once cached). This or --dataset.root is required."
        ),
    )
    root: str | None = flag(
        None, help="A local dataset directory (meta/info.json, meta/stats.json, data/frames.safetensors)."
    )
    revision: str | None = flag(None, help="Hub revision (branch, tag or commit) of --dataset.repo_id.")


@dataclass
class OptimizerConfig:
    type: str = flag("adamw", help="The optimizer.")
    lr: float = flag(
        1e-4,
        help=(
            "Learning rate; never scaled automatically with the number of processes (the banner says what "
            "linear scaling would suggest)."
        ),
    )
    weight_decay: float = flag(1e-4, help="AdamW decoupled weight decay (≥ 0).")
    betas: tuple[float, float] = flag((0.9, 0.999), help="AdamW betas, two numbers in [0, 1): '[0.9,0.999]'.")
    eps: float = flag(1e-8, help="AdamW epsilon (≥ 0).")
    grad_clip_norm: float = flag(10.0, help="Clip the global gradient norm to this (0 disables clipping).")


@dataclass
class SchedulerConfig:
    type: str = flag(
        "cosine",
        help=(
            "Learning-rate schedule over --steps: cosine (after the warmup) or constant; advanced once per "
            "loop step whatever the number of processes."
        ),
    )
    warmup_steps: int = flag(0, help="Loop steps of linear warmup.")
    min_lr_ratio: float = flag(0.1, help="The fraction of --optimizer.lr the cosine schedule ends at, in [0, 1].")


@dataclass
class ParallelismConfig:
    dp_replicate: int = flag(
        1,
        help=(
            "Data-parallel replicas (HSDP: groups of --parallelism.dp_shard ranks); dp_replicate × dp_shard "
            "must equal the processes launched."
        ),
    )
    dp_shard: int = flag(
        1,
        help=(
            "Ranks each replica's parameters, gradients and optimizer state are sharded over (FSDP2); -1: all"
            " launched processes divided by dp_replicate. 1×1 on several processes is DDP."
        ),
    )


@dataclass
class MixedPrecisionPolicyConfig:
    """FSDP2 ``MixedPrecisionPolicy`` fields; once any is set the policy uses these alone."""

    param_dtype: str | None = flag(
        None,
        help=(
            "FSDP2 MixedPrecisionPolicy param_dtype. Once any mixed_precision_policy field is set the policy "
            "is built from these alone, and this one is required."
        ),
    )
    reduce_dtype: str | None = flag(None, help="FSDP2 MixedPrecisionPolicy reduce_dtype (unset: param_dtype).")
    output_dtype: str | None = flag(None, help="FSDP2 MixedPrecisionPolicy output_dtype.")
    cast_forward_inputs: bool | None = flag(None, help="FSDP2 MixedPrecisionPolicy cast_forward_inputs.")

    @property
    def any_set(self) -> bool:
        return any(
            v is not None for v in (self.param_dtype, self.reduce_dtype, self.output_dtype, self.cast_forward_inputs)
        )


@dataclass
class FSDPConfig:
    wrap_modules: list[str] | None = flag(
        None,
        help=(
            "Module class names that become FSDP units, instead of the policy's _fsdp_wrap_modules: "
            "'[\"ACTEncoderLayer\"]'. Exclusive with --accelerator.fsdp.min_num_params."
        ),
    )
    min_num_params: int | None = flag(
        None,
        help=(
            "Make every submodule holding at least this many parameters (not yet in a unit) an FSDP unit. A "
            "value no submodule reaches wraps only the root (a warning says so)."
        ),
    )
    reshard_after_forward: bool = flag(
        True,
        help=(
            "Free each unit's gathered parameters after its forward (false: keep them until the backward; "
            "more memory, fewer all-gathers)."
        ),
    )
    cpu_offload: bool = flag(False, help="Keep sharded parameters, gradients and optimizer state in host memory.")
    ignored_modules: str | None = flag(
        None,
        help=(
            "Regex over module paths to keep unsharded (their gradients are all-reduced by hand); with PEFT "
            "the paths start with base_model.model., so start it with .*"
        ),
    )
    mixed_precision_policy: MixedPrecisionPolicyConfig = field(default_factory=MixedPrecisionPolicyConfig)


@dataclass
class GradientAccumulationConfig:
    steps: int = flag(
        1,
        help=(
            "Micro-batches per optimizer update; gradients are reduced only on the last of each window. "
            "effective batch = batch_size × dp_world_size × this."
        ),
    )


@dataclass
class AcceleratorConfig:
    mixed_precision: str = flag(
        "no",
        help=(
            "Mixed precision: FSDP2's MixedPrecisionPolicy on sharded runs, autocast otherwise; fp16 also "
            "builds a loss scaler (saved as scaler_state.json)."
        ),
    )
    gradient_accumulation: GradientAccumulationConfig = field(default_factory=GradientAccumulationConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class PeftConfig:
    method_type: str = flag(
        "LORA", help="PEFT method. Any --peft.* flag turns PEFT on; it needs --policy.path (the base)."
    )
    r: int = flag(16, help="LoRA rank.")
    lora_alpha: int | None = flag(None, help="LoRA alpha (none: --peft.r).")
    lora_dropout: float = flag(0.0, help="Dropout on the LoRA path, in [0, 1].")
    target_modules: list[str] | None = flag(
        None,
        help=(
            "Linear layers to adapt: '[\"linear1\"]' (none: the policy's linear1, linear2, state_proj and "
            "linear layers, where present)."
        ),
    )
    full_training_modules: list[str] | None = flag(
        None, help="Modules trained in full next to the adapters: '[\"action_head\"]'."
    )


@dataclass
class EMAConfig:
    """LeRobot main's ``--ema.*`` flags (``EMAConfig``): an exponential moving average of the weights.

    ``use_for_eval`` is kept for LeRobot's spelling (this trainer runs no evaluation). The
    schedule and its checks are :mod:`ckpt_tools.format.ema`'s.
    """

    enable: bool = flag(
        False, help="Keep an EMA shadow of the weights, saved in pretrained_model_ema/ (LeRobot's update rule)."
    )
    decay: float | None = flag(None, help="Constant EMA decay at every update (none: the warmup schedule below).")
    update_after_step: int = flag(0, help="Optimizer updates during which the shadow stays a copy of the weights.")
    inv_gamma: float = flag(1.0, help="Warmup schedule: decay = 1 - (1 + t / inv_gamma) ** -power.")
    power: float = flag(0.75, help="Warmup schedule power.")
    min_decay: float = flag(0.0, help="Lower clamp of the scheduled decay.")
    max_decay: float = flag(0.9999, help="Upper clamp of the scheduled decay.")
    use_for_eval: bool = flag(
        True, help="LeRobot's flag (evaluate the EMA weights); kept for its spelling, this trainer runs no eval."
    )


@dataclass
class TrackioConfig:
    enable: bool = flag(False, help="Log the rank-reduced metrics and the config with trackio (the `tracking` extra).")
    project: str | None = flag(None, help="trackio project (none: --job_name, else ckpt-tools).")


@dataclass
class CheckpointConfig:
    """How the run keeps its checkpoints, and what a new run starts from (``--checkpoint.<field>``)."""

    keep_last_n: int | None = flag(
        None,
        help=(
            "Keep the newest N checkpoints: each save removes older step dirs once it is committed (never the"
            " one `last` points at, the newest resumable one, or one a tool is reading). Unset: keep all. "
            "ckpt-tools prune does the same for a finished run."
        ),
    )
    last_link: str = flag(
        "auto",
        help=(
            "How checkpoints/last is written: auto = a symlink, a pointer file holding the step dir's name "
            "where the file system refuses symlinks; file = always the pointer file (stores that mangle "
            "symlinks). Every reader takes either."
        ),
    )
    load_from: str | None = flag(
        None,
        help=(
            "Start this new run (step 0, in --output_dir) from another run's checkpoint: a step dir, `last`, "
            "checkpoints/ or a run's output dir (its `last`); any layout, onto any topology. Without a "
            "--policy.* flag the policy is the one it holds. Not with --resume=true."
        ),
    )
    load: str | None = flag(
        None,
        help=(
            "The parts of --checkpoint.load_from to load, a comma list of model, optimizer, scheduler, "
            "scaler, rng, or all (a resume's set); the others start fresh (unset: model, the weights only)."
        ),
        shown_default="model (the weights only) when --checkpoint.load_from is given",
    )


@dataclass
class TrainConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    policy: PolicyConfig | None = None
    output_dir: str | None = flag(
        None, help="Where the run writes checkpoints/ and metrics.jsonl.", shown_default="none (required)"
    )
    job_name: str | None = flag(None, help="Name of the run (the trackio run name and default project).")
    seed: int = flag(1000, help="Seed of the initial weights, the data order and each worker's dropout masks.")
    steps: int = flag(100, help="Loop steps to train: per-worker micro-batches, not optimizer updates (as in LeRobot).")
    batch_size: int = flag(8, help="Samples per worker per step; a step consumes batch_size × dp_world_size samples.")
    # None: DEFAULT_SAVE_FREQ rounded up to a multiple of the accumulation steps, filled in by
    # fill_defaults (the saved config holds the number).
    save_freq: int | None = flag(
        None,
        help=(
            "Loop steps between checkpoints; the final step is always saved. Must be a multiple of "
            "--accelerator.gradient_accumulation.steps (a checkpoint never falls inside an accumulation "
            "window)."
        ),
        shown_default=f"{DEFAULT_SAVE_FREQ}, rounded up to a multiple of --accelerator.gradient_accumulation.steps",
    )
    save_checkpoint: bool = flag(True, help="Write checkpoints at all.")
    log_freq: int = flag(10, help="Loop steps between logged steps (rank-averaged loss, samples/s, lr).")
    checkpoint_format: str = flag(
        CheckpointFormat.SAFETENSORS.value,
        help=(
            "What pretrained_model/ holds on a sharded run: one gathered model.safetensors, DCP shards "
            "(pytorch_model_fsdp_0/), or both. A non-sharded run always saves safetensors."
        ),
    )
    checkpoint_async: bool = flag(
        False,
        help=(
            "Stage the state to host memory and write the checkpoint in the background while training goes on"
            " (at most one save in flight; the same atomic commit and `last` rule)."
        ),
    )
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: bool = flag(
        False,
        help=(
            "true: continue from --config_path's checkpoint: weights, optimizer, scheduler, loss scaler, RNG "
            "and data position, resharded onto this launch's topology. auto: resume --output_dir's "
            "checkpoints/last (checked as true checks it) if there is one, else start a new run - the same "
            "command for the first launch and every torchrun --max-restarts relaunch (docs/resume.md)."
        ),
    )
    overwrite_checkpoints: bool = flag(
        False,
        help=(
            "Let a resume save over the checkpoints after the step it resumes from (refused otherwise). Never"
            " carried over by a later resume."
        ),
    )
    progress_bar: bool = flag(True, help="Show a tqdm progress bar on the main rank.")
    collective_timeout_s: float = flag(
        600.0,
        help=(
            "Seconds a rank waits for the others in a collective: a rank that died or stalled ends the job "
            "with an error after this, never a hang."
        ),
    )
    log_samples: bool = flag(
        False,
        help=(
            "Append the dataset indices each rank consumes per step to <output_dir>/samples/rank<R>.jsonl (an"
            " audit trail of data order)."
        ),
    )
    max_nonfinite_steps: int = flag(
        0,
        help=(
            "Optimizer updates the run may skip because the loss (or, without a loss scaler, the gradient "
            "norm) is NaN or infinite; the next one stops it with exit code 7."
        ),
    )
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
        """What the start-up rules check, read off this config by the reader the tools use on ``train_config.json``.

        The same lookup and the same lenient readers, so trainer and tools check the same values;
        the paths are read as given (a flag is relative to the current directory).
        """
        return read_run_settings(self)

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
        for option, repo_id in (("--dataset.repo_id", self.dataset.repo_id), ("--policy.repo_id", self.policy.repo_id)):
            if repo_id is not None:
                try:
                    check_repo_id(repo_id, flag=option)
                except UsageError as e:
                    raise ConfigError(str(e)) from None

    def validate_for_world(self, world_size: int) -> tuple[int, int]:
        """(dp_replicate, dp_shard) for a launch of ``world_size`` processes, or the first refusal."""
        mesh, refusals = world_refusals(self.run_settings(), world_size)
        if refusals:
            raise ConfigError(refusals[0].message)
        assert mesh is not None
        return mesh


# The tools read train_config.json's top level from format/train_config.py's lists (no draccus
# there): this config must match them, or no trainer starts.
_TOP_LEVEL_MISMATCH = top_level_mismatch(TrainConfig)
if _TOP_LEVEL_MISMATCH is not None:
    raise RuntimeError(_TOP_LEVEL_MISMATCH)


def train_config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as ``train_config.json`` holds it (and the experiment tracker records it)."""
    encoded = draccus.encode(cfg)
    assert isinstance(encoded, dict)
    return encoded
