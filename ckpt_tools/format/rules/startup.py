"""The start-up rules of a training run: what it refuses, and the data-parallel mesh it builds.

The trainer applies them to its parsed flags - :func:`setting_refusals` before any process
group exists, :func:`world_refusals` once the launcher's world size is known - and stops at
the first refusal. ``reshard-plan`` and ``verify-resume`` apply the same functions to a
checkpoint's ``train_config.json`` merged with the resume flags, and list every refusal. A
refusal is one line naming the trainer's flag; whoever asks gets the same line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ckpt_tools.format.layout import CheckpointFormat
from ckpt_tools.format.rules.ignored_modules import pattern_problem
from ckpt_tools.format.rules.run_settings import RunSettings
from ckpt_tools.format.rules.saved_format import saved_format

MIXED_PRECISION_CHOICES = ("no", "bf16", "fp16")
POLICY_DTYPES = ("float32", "bfloat16", "float16")  # FSDP2 MixedPrecisionPolicy fields
OPTIMIZER_TYPES = ("adamw",)
SCHEDULER_TYPES = ("cosine", "constant")
LAST_LINK_CHOICES = ("auto", "file")  # how the trainer writes `last` (ckpt_tools.io.fsutil.replace_link_or_pointer)
PEFT_METHODS = ("LORA",)
CHECKPOINT_FORMATS = tuple(f.value for f in CheckpointFormat)
FLOAT32_MAX = 3.4028234663852886e38  # torch turns AdamW's step size and decay factor into float32 scalars
MAX_STEPS = 10**12
SEED_LIMIT = 2**62
# --save_freq when not given, in loop steps (what --steps counts, as in LeRobot); rounded up to
# a whole number of accumulation windows by :func:`default_save_freq`.
DEFAULT_SAVE_FREQ = 50

# The trainer's flag for each setting a fix names.
FLAGS = {
    "dp_replicate": "--parallelism.dp_replicate",
    "dp_shard": "--parallelism.dp_shard",
    "checkpoint_format": "--checkpoint_format",
}

Mesh = tuple[int, int]  # (dp_replicate, dp_shard)


@dataclass(frozen=True)
class Fix:
    """Settings that would pass instead of the refused ones, e.g. ``dp_replicate=1, dp_shard=2``."""

    settings: tuple[tuple[str, object], ...]
    label: str = ""  # what it gives, e.g. "FSDP"

    def spell(self, flags: Mapping[str, str] = FLAGS, sep: str = "=") -> str:
        """The fix as flags: the trainer's by default; a tool passes its own names (and ``sep=" "``)."""
        return " ".join(f"{flags[name]}{sep}{value}" for name, value in self.settings)


@dataclass(frozen=True)
class Refusal:
    """One start-up refusal: what is wrong, naming the flag, and the settings that would pass."""

    reason: str
    fixes: tuple[Fix, ...] = ()

    @property
    def message(self) -> str:
        """The one line the trainer prints."""
        if not self.fixes:
            return self.reason
        fixes = [f"{fix.spell()} ({fix.label})" if fix.label else fix.spell() for fix in self.fixes]
        return f"{self.reason}; pass {' or '.join(fixes)}"

    def __str__(self) -> str:
        return self.message


def _one_of(choices: Sequence[str]) -> str:
    return ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]


# ====================================================================== before any process group


def setting_refusals(s: RunSettings) -> list[Refusal]:
    """Every refusal that needs no world size, in the order the trainer checks them."""
    found = _finite(s) + _counts(s) + _choices(s) + _ranges(s) + _accelerator(s) + _peft(s) + _load(s) + _ema(s)
    return [Refusal(text) for text in found]


def _is_finite(value: object) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def _finite(s: RunSettings) -> list[str]:
    """NaN and ±inf fail no ``<=`` test, so they are refused first, by name, whatever the field."""
    out = []
    for flag, value in s.numbers:
        if isinstance(value, (list, tuple)):
            if not all(_is_finite(v) for v in value):
                out.append(f"{flag}={list(value)}: every value must be a finite number")
        elif not _is_finite(value):
            out.append(f"{flag}={value}: must be a finite number")
    return out


def _ranges(s: RunSettings) -> list[str]:
    """The bounds torch (or the schedule) needs; a non-finite value is :func:`_finite`'s to report."""

    def below(value: float | None, low: float) -> bool:
        return value is not None and math.isfinite(value) and value < low

    def outside(value: float | None, low: float, high: float) -> bool:
        return value is not None and math.isfinite(value) and not low <= value <= high

    out = []
    if below(s.weight_decay, 0):
        out.append(f"--optimizer.weight_decay={s.weight_decay}: must be ≥ 0")
    betas = list(s.betas) if s.betas is not None else []
    finite_betas = s.betas is not None and all(_is_finite(b) for b in betas)
    if finite_betas and (len(betas) != 2 or not all(0 <= b < 1 for b in betas)):
        out.append(f"--optimizer.betas={betas}: must be two numbers in [0, 1)")
    out.extend(_overflows(s))
    if below(s.eps, 0):
        out.append(f"--optimizer.eps={s.eps}: must be ≥ 0")
    if below(s.grad_clip_norm, 0):
        out.append(f"--optimizer.grad_clip_norm={s.grad_clip_norm}: must be ≥ 0 (0 disables clipping)")
    if s.warmup_steps is not None and s.warmup_steps < 0:
        out.append(f"--scheduler.warmup_steps={s.warmup_steps}: must be ≥ 0")
    if outside(s.min_lr_ratio, 0, 1):
        out.append(
            f"--scheduler.min_lr_ratio={s.min_lr_ratio}: must be between 0 and 1"
            " (the fraction of --optimizer.lr the cosine schedule ends at)"
        )
    if outside(s.dropout, 0, 1):
        out.append(f"--policy.dropout={s.dropout}: must be between 0 and 1")
    if s.max_nonfinite_steps is not None and s.max_nonfinite_steps < 0:
        out.append(f"--max_nonfinite_steps={s.max_nonfinite_steps}: must be ≥ 0 (0: stop at the first non-finite loss)")
    return out


def _overflows(s: RunSettings) -> list[str]:
    """A finite lr so large that AdamW's first update overflows float32 (torch raises mid-step)."""
    lr = s.lr
    if lr is None or not math.isfinite(lr) or lr <= 0:
        return []
    out = []
    betas = s.betas
    if betas is not None and len(betas) == 2 and _is_finite(betas[0]) and 0 <= betas[0] < 1:
        step_size = lr / (1 - betas[0])  # lr / bias correction at the first step
        if step_size > FLOAT32_MAX:
            out.append(
                f"--optimizer.lr={lr}: too large: AdamW's first step size, lr / (1 - betas[0]) = {step_size:.3g},"
                " overflows float32"
            )
    decay = s.weight_decay
    if decay is not None and math.isfinite(decay) and lr * decay > FLOAT32_MAX:
        out.append(f"--optimizer.lr={lr} × --optimizer.weight_decay={decay} = {lr * decay:.3g} overflows float32")
    return out


def _counts(s: RunSettings) -> list[str]:
    out = []
    if s.steps is not None and s.steps > MAX_STEPS:
        out.append(f"--steps={s.steps}: at most {MAX_STEPS:,} (the step counters and sample counts must fit 64 bits)")
    if s.seed is not None and not -SEED_LIMIT <= s.seed < SEED_LIMIT:
        out.append(
            f"--seed={s.seed}: must lie within ±2**62 (the generators are seeded with it plus the epoch, rank and"
            " step, in 64 bits)"
        )
    for name, value in (
        ("steps", s.steps),
        ("batch_size", s.batch_size),
        ("save_freq", s.save_freq),
        ("log_freq", s.log_freq),
    ):
        if value is not None and value <= 0:
            out.append(f"--{name}={value}: must be a positive integer")
    if s.keep_last_n is not None and s.keep_last_n < 1:
        out.append(
            f"--checkpoint.keep_last_n={s.keep_last_n}: must be ≥ 1 (the number of newest checkpoints kept; unset"
            " keeps all)"
        )
    if s.collective_timeout_s is not None and s.collective_timeout_s <= 0:
        out.append(f"--collective_timeout_s={s.collective_timeout_s}: must be positive (seconds)")
    accum = s.grad_accum_steps
    if accum is not None and accum <= 0:
        out.append(f"--accelerator.gradient_accumulation.steps={accum}: must be ≥ 1")
    elif accum is not None and s.save_freq is not None and s.save_freq > 0 and s.save_freq % accum:
        out.append(
            f"--save_freq={s.save_freq}: must be a multiple of --accelerator.gradient_accumulation.steps={accum}"
            f" (a checkpoint must not fall inside an accumulation window); pass --save_freq={_round_up(s.save_freq, accum)}"
        )
    return out


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def default_save_freq(grad_accum_steps: int | None) -> int:
    """``--save_freq`` when the flag is not given: :data:`DEFAULT_SAVE_FREQ` loop steps, rounded up
    to a multiple of the accumulation steps.

    ``--save_freq`` counts loop steps, as ``--steps`` does (LeRobot counts both that way), and a
    checkpoint must not fall inside an accumulation window, so an explicit value that is not a
    multiple is refused. A default cannot be the user's mistake, so it is rounded instead: with
    ``--accelerator.gradient_accumulation.steps=4`` a run saves every 52 steps (13 updates).
    """
    accum = grad_accum_steps if grad_accum_steps is not None and grad_accum_steps > 0 else 1
    return _round_up(DEFAULT_SAVE_FREQ, accum)


def default_save_freq_note(grad_accum_steps: int) -> str | None:
    """What the start-up says about the default ``--save_freq`` (None: nothing, no accumulation)."""
    if grad_accum_steps <= 1:
        return None
    chosen = default_save_freq(grad_accum_steps)
    how = "a multiple of" if chosen == DEFAULT_SAVE_FREQ else f"{DEFAULT_SAVE_FREQ} rounded up to a multiple of"
    return (
        f"--save_freq not given: a checkpoint every {chosen} loop steps ({how}"
        f" --accelerator.gradient_accumulation.steps={grad_accum_steps}: every {chosen // grad_accum_steps}"
        " optimizer updates)"
    )


def _choices(s: RunSettings) -> list[str]:
    out = []
    if s.checkpoint_format is not None and s.checkpoint_format not in CHECKPOINT_FORMATS:
        out.append(f"--checkpoint_format={s.checkpoint_format}: choose one of {', '.join(CHECKPOINT_FORMATS)}")
    if s.last_link is not None and s.last_link not in LAST_LINK_CHOICES:
        out.append(f"--checkpoint.last_link={s.last_link}: choose {_one_of(LAST_LINK_CHOICES)}")
    if s.optimizer_type is not None and s.optimizer_type not in OPTIMIZER_TYPES:
        out.append(f"--optimizer.type={s.optimizer_type}: only {_one_of(OPTIMIZER_TYPES)} is supported")
    if s.lr is not None and s.lr <= 0:
        out.append(f"--optimizer.lr={s.lr}: must be positive")
    if s.scheduler_type is not None and s.scheduler_type not in SCHEDULER_TYPES:
        out.append(f"--scheduler.type={s.scheduler_type}: choose {_one_of(SCHEDULER_TYPES)}")
    return out


def _accelerator(s: RunSettings) -> list[str]:
    out = []
    if s.mixed_precision is not None and s.mixed_precision not in MIXED_PRECISION_CHOICES:
        out.append(f"--accelerator.mixed_precision={s.mixed_precision}: choose {_one_of(MIXED_PRECISION_CHOICES)}")
    if s.wrap_modules is not None and s.min_num_params is not None:
        out.append("--accelerator.fsdp.wrap_modules and --accelerator.fsdp.min_num_params are exclusive: pass one")
    if s.min_num_params is not None and s.min_num_params <= 0:
        out.append(f"--accelerator.fsdp.min_num_params={s.min_num_params}: must be positive")
    problem = pattern_problem(s.ignored_modules)
    if problem is not None:
        out.append(f"--accelerator.fsdp.ignored_modules: not a valid regex ({problem})")
    policy = s.mixed_precision_policy
    prefix = "--accelerator.fsdp.mixed_precision_policy"
    for name in ("param_dtype", "reduce_dtype", "output_dtype"):
        value = policy.get(name)
        if value is not None and value not in POLICY_DTYPES:
            out.append(f"{prefix}.{name}={value}: choose {_one_of(POLICY_DTYPES)}")
    if policy and policy.get("param_dtype") is None:
        out.append(
            f"{prefix}.param_dtype is required once any mixed_precision_policy field is set"
            " (the policy is built from those fields alone)"
        )
    uses_fp16 = "float16" in (policy.get("param_dtype"), policy.get("reduce_dtype"), policy.get("output_dtype"))
    if uses_fp16 and s.mixed_precision != "fp16":
        out.append(f"{prefix}.*=float16 needs --accelerator.mixed_precision=fp16 (it builds the loss scaler)")
    return out


def _peft(s: RunSettings) -> list[str]:
    if not s.peft:
        return []
    out = []
    if s.peft_method is not None and s.peft_method.upper() not in PEFT_METHODS:
        out.append(f"--peft.method_type={s.peft_method}: only {_one_of(PEFT_METHODS)} is supported")
    if not s.policy_path:
        out.append("--peft.* needs --policy.path (the saved base policy the adapter is trained on)")
    if s.peft_r is not None and s.peft_r <= 0:
        out.append(f"--peft.r={s.peft_r}: must be positive")
    return out


def _load(s: RunSettings) -> list[str]:
    # Imported here: load_parts reads the manifest, whose train_config.json reader imports
    # ckpt_tools.format.rules, whose __init__ imports this module.
    from ckpt_tools.format.rules.load_parts import setting_problems

    return setting_problems(s.load_from, s.load, resume=s.resume, peft=s.peft, policy_path=s.policy_path)


def _ema(s: RunSettings) -> list[str]:
    """LeRobot's checks of the ``--ema.*`` values, and its refusal of EMA with PEFT (the adapter is all that trains)."""
    if not s.ema_enable:
        return []
    out = []
    if s.ema_schedule is not None:
        problem = s.ema_schedule.refusal()
        if problem is not None:
            out.append(problem)
    if s.peft:
        out.append("--ema.enable=true is not supported together with --peft.* (as in LeRobot)")
    return out


# ====================================================================== once the world size is known


def resolve_parallelism(dp_replicate: int, dp_shard: int, world_size: int) -> tuple[Mesh | None, Refusal | None]:
    """The (dp_replicate, dp_shard) mesh a launch of ``world_size`` processes builds, or its refusal.

    ``dp_shard=-1`` takes the processes ``dp_replicate`` leaves; ``1×1`` on several processes
    is a plain multi-process launch, DDP over every process.
    """
    r, s = dp_replicate, dp_shard
    refusal = mesh_value_refusal(r, s)
    if refusal is not None:
        return None, refusal
    if s == -1:
        if world_size % r:
            return None, Refusal(
                f"--parallelism.dp_shard=-1 with --parallelism.dp_replicate={r}: world size {world_size}"
                f" is not divisible by {r}"
            )
        s = world_size // r
    if r * s == 1 and world_size > 1:
        return (world_size, 1), None
    if r * s != world_size:
        return None, Refusal(
            f"--parallelism.dp_replicate × --parallelism.dp_shard = {r}×{s} = {r * s}"
            f" ≠ world size {world_size} (processes launched)",
            _fitting(world_size),
        )
    return (r, s), None


def mesh_value_refusal(dp_replicate: int | None, dp_shard: int | None) -> Refusal | None:
    """Mesh sizes that no world size accepts (None: not given)."""
    if dp_replicate is not None and dp_replicate <= 0:
        return Refusal(f"--parallelism.dp_replicate={dp_replicate}: must be ≥ 1")
    if dp_shard is not None and dp_shard <= 0 and dp_shard != -1:
        return Refusal(f"--parallelism.dp_shard={dp_shard}: must be ≥ 1 or -1 (all launched processes)")
    return None


def _fitting(world_size: int) -> tuple[Fix, ...]:
    """Meshes that fit ``world_size`` processes: FSDP over all of them, or DDP."""
    one = Fix((("dp_replicate", 1), ("dp_shard", 1)))
    if world_size == 1:
        return (one,)
    return Fix((("dp_replicate", 1), ("dp_shard", world_size)), "FSDP"), Fix(one.settings, "DDP")


def world_refusals(s: RunSettings, world_size: int) -> tuple[Mesh | None, list[Refusal]]:
    """The mesh ``world_size`` processes build from ``s`` (None: refused) and what the world size refuses.

    ``dp_replicate`` / ``dp_shard`` left None read as 1 (the trainer's defaults).
    """
    mesh, refusal = resolve_parallelism(
        1 if s.dp_replicate is None else s.dp_replicate, 1 if s.dp_shard is None else s.dp_shard, world_size
    )
    if mesh is None:
        assert refusal is not None
        return None, [refusal]
    out = []
    sharded = mesh[1] > 1
    if not sharded:
        fmt = s.checkpoint_format
        if fmt is not None and fmt in CHECKPOINT_FORMATS:
            saved = saved_format(CheckpointFormat(fmt), sharded)
            if saved.value != fmt:
                out.append(
                    Refusal(
                        f"--checkpoint_format={fmt}: DCP shards need a sharded run (--parallelism.dp_shard > 1)",
                        (Fix((("checkpoint_format", saved.value),), "what non-sharded runs save"),),
                    )
                )
        if s.mixed_precision_policy:
            out.append(
                Refusal(
                    "--accelerator.fsdp.mixed_precision_policy.* applies to sharded runs only"
                    " (use --accelerator.mixed_precision)"
                )
            )
    return mesh, out
