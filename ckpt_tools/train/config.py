"""The training configuration: dataclasses whose fields are the dotted flags of ``ckpt-train``.

``--group.field=value`` maps onto these dataclasses through draccus. Static validation
happens in ``validate`` (start-up, before any process group exists) and topology-dependent
validation in ``validate_for_world``; both raise :class:`ConfigError` naming the flag. The
saved ``train_config.json`` is exactly the object that ran (dataset-derived sizes filled
in), and ``--resume`` reads it back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ckpt_tools.errors import ConfigError, UsageError
from ckpt_tools.format.layout import CheckpointFormat
from ckpt_tools.train.policies.configs import PolicyConfig

MIXED_PRECISION_CHOICES = ("no", "bf16", "fp16")
POLICY_DTYPES = ("float32", "bfloat16", "float16")


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
class TrackioConfig:
    enable: bool = False
    project: str | None = None


@dataclass
class TrainConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    policy: PolicyConfig | None = None
    output_dir: str | None = None
    job_name: str | None = None
    seed: int = 1000
    steps: int = 100
    batch_size: int = 8
    save_freq: int = 50
    save_checkpoint: bool = True
    log_freq: int = 10
    checkpoint_format: str = CheckpointFormat.SAFETENSORS.value
    # Stage the state to host memory and write the checkpoint in the background while the
    # loop goes on (at most one save in flight; the same atomic commit and `last` rule).
    checkpoint_async: bool = False
    resume: bool = False
    progress_bar: bool = True
    # How long a rank waits in a collective for the others: a rank that dies or stalls (a
    # wedged process, a lost node) ends the job with an error after this, instead of a hang.
    collective_timeout_s: float = 600.0
    # Audit trail of data order: each rank appends the dataset indices it consumes per step
    # to <output_dir>/samples/rank<R>.jsonl.
    log_samples: bool = False
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    accelerator: AcceleratorConfig = field(default_factory=AcceleratorConfig)
    peft: PeftConfig | None = None
    trackio: TrackioConfig = field(default_factory=TrackioConfig)

    @property
    def grad_accum_steps(self) -> int:
        return self.accelerator.gradient_accumulation.steps

    @property
    def format(self) -> CheckpointFormat:
        return CheckpointFormat(self.checkpoint_format)

    def validate(self) -> None:
        """Checks that need no process group: every message names its flag."""
        if self.policy is None:
            raise ConfigError("--policy.type (or --policy.path) is required")
        if not self.output_dir:
            raise ConfigError("--output_dir is required")
        for name in ("steps", "batch_size", "save_freq", "log_freq"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name}={getattr(self, name)}: must be a positive integer")
        if self.collective_timeout_s <= 0:
            raise ConfigError(f"--collective_timeout_s={self.collective_timeout_s}: must be positive (seconds)")
        if self.grad_accum_steps <= 0:
            raise ConfigError(f"--accelerator.gradient_accumulation.steps={self.grad_accum_steps}: must be ≥ 1")
        if self.save_freq % self.grad_accum_steps:
            raise ConfigError(
                f"--save_freq={self.save_freq}: must be a multiple of"
                f" --accelerator.gradient_accumulation.steps={self.grad_accum_steps}"
                " (a checkpoint must not fall inside an accumulation window)"
            )
        if self.checkpoint_format not in {f.value for f in CheckpointFormat}:
            raise ConfigError(
                f"--checkpoint_format={self.checkpoint_format}: choose one of safetensors, dcp, safetensors_dcp"
            )
        if self.optimizer.type != "adamw":
            raise ConfigError(f"--optimizer.type={self.optimizer.type}: only adamw is supported")
        if self.optimizer.lr <= 0:
            raise ConfigError(f"--optimizer.lr={self.optimizer.lr}: must be positive")
        if self.scheduler.type not in ("cosine", "constant"):
            raise ConfigError(f"--scheduler.type={self.scheduler.type}: choose cosine or constant")
        self._validate_accelerator()
        self._validate_peft()
        if self.policy.repo_id is not None:
            from ckpt_tools.hub import check_repo_id

            try:
                check_repo_id(self.policy.repo_id, flag="--policy.repo_id")
            except UsageError as e:
                raise ConfigError(str(e)) from None

    def _validate_accelerator(self) -> None:
        acc = self.accelerator
        if acc.mixed_precision not in MIXED_PRECISION_CHOICES:
            raise ConfigError(f"--accelerator.mixed_precision={acc.mixed_precision}: choose no, bf16 or fp16")
        fsdp = acc.fsdp
        if fsdp.wrap_modules is not None and fsdp.min_num_params is not None:
            raise ConfigError(
                "--accelerator.fsdp.wrap_modules and --accelerator.fsdp.min_num_params are exclusive: pass one"
            )
        if fsdp.min_num_params is not None and fsdp.min_num_params <= 0:
            raise ConfigError(f"--accelerator.fsdp.min_num_params={fsdp.min_num_params}: must be positive")
        if fsdp.ignored_modules is not None:
            try:
                re.compile(fsdp.ignored_modules)
            except re.error as e:
                raise ConfigError(f"--accelerator.fsdp.ignored_modules: not a valid regex ({e})") from None
        policy = fsdp.mixed_precision_policy
        prefix = "--accelerator.fsdp.mixed_precision_policy"
        for name in ("param_dtype", "reduce_dtype", "output_dtype"):
            value = getattr(policy, name)
            if value is not None and value not in POLICY_DTYPES:
                raise ConfigError(f"{prefix}.{name}={value}: choose float32, bfloat16 or float16")
        if policy.any_set and policy.param_dtype is None:
            raise ConfigError(
                f"{prefix}.param_dtype is required once any mixed_precision_policy field is set"
                " (the policy is built from those fields alone)"
            )
        uses_fp16 = "float16" in (policy.param_dtype, policy.reduce_dtype, policy.output_dtype)
        if uses_fp16 and acc.mixed_precision != "fp16":
            raise ConfigError(
                f"{prefix}.*=float16 needs --accelerator.mixed_precision=fp16 (it builds the loss scaler)"
            )

    def _validate_peft(self) -> None:
        if self.peft is None:
            return
        if self.peft.method_type.upper() != "LORA":
            raise ConfigError(f"--peft.method_type={self.peft.method_type}: only LORA is supported")
        if self.policy is not None and not self.policy.path:
            raise ConfigError("--peft.* needs --policy.path (the saved base policy the adapter is trained on)")
        if self.peft.r <= 0:
            raise ConfigError(f"--peft.r={self.peft.r}: must be positive")

    def resolve_parallelism(self, world_size: int) -> tuple[int, int]:
        """(dp_replicate, dp_shard) for this launch; ``dp_shard=-1`` takes what is left."""
        r, s = self.parallelism.dp_replicate, self.parallelism.dp_shard
        if r <= 0:
            raise ConfigError(f"--parallelism.dp_replicate={r}: must be ≥ 1")
        if s == -1:
            if world_size % r:
                raise ConfigError(
                    f"--parallelism.dp_shard=-1 with --parallelism.dp_replicate={r}: world size {world_size}"
                    f" is not divisible by {r}"
                )
            s = world_size // r
        elif s <= 0:
            raise ConfigError(f"--parallelism.dp_shard={s}: must be ≥ 1 or -1 (all launched processes)")
        if r * s == 1 and world_size > 1:
            return world_size, 1  # plain multi-process launch: DDP over every process
        if r * s != world_size:
            raise ConfigError(
                f"--parallelism.dp_replicate × --parallelism.dp_shard = {r}×{s} = {r * s}"
                f" ≠ world size {world_size} (processes launched)"
            )
        return r, s

    def validate_for_world(self, world_size: int) -> tuple[int, int]:
        r, s = self.resolve_parallelism(world_size)
        sharded = s > 1
        fsdp = self.accelerator.fsdp
        if not sharded:
            if self.format is not CheckpointFormat.SAFETENSORS:
                raise ConfigError(
                    f"--checkpoint_format={self.checkpoint_format}: DCP shards need a sharded run"
                    " (--parallelism.dp_shard > 1); non-sharded runs save safetensors"
                )
            if fsdp.mixed_precision_policy.any_set:
                raise ConfigError(
                    "--accelerator.fsdp.mixed_precision_policy.* applies to sharded runs only"
                    " (use --accelerator.mixed_precision)"
                )
        return r, s
