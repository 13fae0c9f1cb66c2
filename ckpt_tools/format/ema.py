"""The EMA of the weights: LeRobot main's settings, its decay schedule, and the resume rule - defined once.

LeRobot main (``src/lerobot/configs/default.py`` ``EMAConfig``, ``src/lerobot/scripts/lerobot_train.py``)
keeps the shadow with diffusers' ``EMAModel`` built with ``use_ema_warmup=True``: after each
optimizer update, for every parameter (buffers are not averaged)::

    step  = max(0, optimization_step - update_after_step - 1)
    decay = 0.0 if step <= 0 else 1 - (1 + step / inv_gamma) ** -power, clamped to [min_decay, max_decay]
    shadow -= (1 - decay) * (shadow - param)        # a frozen parameter is copied instead

A constant ``--ema.decay`` is LeRobot's clamp pinned at that value (min = max = decay). The
trainer runs this arithmetic (``ckpt_tools.train.ema``) and the tools read the settings back
from ``train_config.json``; both call these functions, so the numbers cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_tools.format.layout import DCP_METADATA, StepPaths
from ckpt_tools.format.record import TrainingStep

# LeRobot's EMAConfig defaults (its __post_init__ compares against these literals too).
DEFAULT_MIN_DECAY = 0.0
DEFAULT_MAX_DECAY = 0.9999


@dataclass(frozen=True)
class EmaSchedule:
    """The EMA flags as LeRobot spells them (``--ema.<field>``), less ``enable`` and ``use_for_eval``."""

    decay: float | None = None  # constant decay (openpi-style); None: the warmup schedule
    update_after_step: int = 0
    inv_gamma: float = 1.0
    power: float = 0.75
    min_decay: float = DEFAULT_MIN_DECAY
    max_decay: float = DEFAULT_MAX_DECAY

    @property
    def clamp(self) -> tuple[float, float]:
        """(min, max) of the decay: a constant decay pins both, as LeRobot builds its EMAModel."""
        if self.decay is not None:
            return self.decay, self.decay
        return self.min_decay, self.max_decay

    def refusal(self) -> str | None:
        """LeRobot's own checks of these values (``EMAConfig.__post_init__``), as one line; None: valid."""
        if not 0.0 <= self.min_decay <= self.max_decay <= 1.0:
            return (
                f"--ema.min_decay={self.min_decay} --ema.max_decay={self.max_decay}: expected"
                " 0 <= min_decay <= max_decay <= 1"
            )
        if self.inv_gamma <= 0:
            return f"--ema.inv_gamma={self.inv_gamma}: must be positive"
        if self.power <= 0:
            return f"--ema.power={self.power}: must be positive"
        if self.update_after_step < 0:
            return f"--ema.update_after_step={self.update_after_step}: must be >= 0"
        if self.decay is not None:
            if not 0.0 <= self.decay <= 1.0:
                return f"--ema.decay={self.decay}: must be in [0, 1]"
            if (self.min_decay, self.max_decay) != (DEFAULT_MIN_DECAY, DEFAULT_MAX_DECAY):
                return (
                    "--ema.decay (a constant decay) and --ema.min_decay/--ema.max_decay (the schedule's clamp)"
                    " are mutually exclusive: set one or the other"
                )
        return None

    def decay_at(self, optimization_step: int) -> float:
        """The decay of update number ``optimization_step`` (1 for the first): diffusers' ``EMAModel.get_decay``."""
        step = max(0, optimization_step - self.update_after_step - 1)
        if step <= 0:
            return 0.0
        value = 1 - (1 + step / self.inv_gamma) ** -self.power
        low, high = self.clamp
        value = min(value, high)
        return max(value, low)


def schedule_from_config(ema: Mapping[str, Any]) -> EmaSchedule:
    """The ``ema`` group of a ``train_config.json`` (ckpt-train's or LeRobot main's): missing fields default."""
    defaults = EmaSchedule()

    def number(name: str, default: float) -> float:
        value = ema.get(name, default)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

    decay = ema.get("decay")
    after = ema.get("update_after_step", defaults.update_after_step)
    return EmaSchedule(
        decay=float(decay) if isinstance(decay, (int, float)) and not isinstance(decay, bool) else None,
        update_after_step=after if isinstance(after, int) and not isinstance(after, bool) else 0,
        inv_gamma=number("inv_gamma", defaults.inv_gamma),
        power=number("power", defaults.power),
        min_decay=number("min_decay", defaults.min_decay),
        max_decay=number("max_decay", defaults.max_decay),
    )


def ema_enabled(config: Mapping[str, Any]) -> bool | None:
    """``ema.enable`` of a ``train_config.json`` (None: the file has no ``ema`` group, or no boolean there)."""
    ema = config.get("ema")
    value = ema.get("enable") if isinstance(ema, dict) else None
    return value if isinstance(value, bool) else None


def no_ema_weights(paths: StepPaths) -> str:
    """The line for a step asked for its EMA weights (``convert-dcp --ema``, ``push --ema``) that has none."""
    return f"{paths.root}: holds no EMA weights (no {paths.pretrained_model_ema.name}/: saved without --ema.enable)"


def checkpoint_has_ema(paths: StepPaths, record: TrainingStep) -> bool:
    """Whether the checkpoint holds an EMA shadow: ckpt-train's record says so; for LeRobot's, its files do."""
    if record.ema_steps is not None:
        return True
    return paths.ema_state.is_file() or (paths.ema_model_dcp / DCP_METADATA).is_file()


def resume_refusal(paths: StepPaths, record: TrainingStep, enabled: bool | None) -> str | None:
    """Why a resume with ``--ema.enable=<enabled>`` cannot continue ``paths`` bit-exactly, or None.

    The one rule for ``ckpt-train --resume`` and ``verify-resume``. A checkpoint without EMA
    state resumed with EMA on would start the shadow from the resumed weights (LeRobot warns
    and does so); one with EMA state resumed with EMA off would drop the shadow. Both are
    refused: the run that continues is not the run that was saved. ``enabled`` None (the
    config does not say) is not checked.
    """
    if enabled is None:
        return None
    saved = checkpoint_has_ema(paths, record)
    if enabled and not saved:
        return (
            f"{paths.root}: --ema.enable=true, but this checkpoint holds no EMA state (saved without --ema.enable):"
            " the shadow cannot be continued; resume with --ema.enable=false, or start a new run from its weights"
            f" (--policy.path={paths.pretrained_model})"
        )
    if not enabled and saved:
        return (
            f"{paths.root}: --ema.enable=false, but this checkpoint holds EMA state ({paths.pretrained_model_ema.name}/):"
            " resuming without it would drop the shadow; resume with --ema.enable=true"
        )
    return None


def schedule_change(found: tuple[EmaSchedule, str] | None, schedule: EmaSchedule) -> str | None:
    """The resumed ``--ema.*`` values that differ from the saved run's, as one line; None: the same (or unknown).

    ``found``: the saved schedule and where it was read (:func:`ckpt_tools.facts.ema.saved_schedule`),
    None when nothing says. The shadow continues bit-exactly only under the schedule that built it,
    so a change is refused like a changed optimizer setting
    (:mod:`ckpt_tools.format.rules.saved_hyperparameters`), by the trainer and ``verify-resume``
    alike. Compared as the update computes: the clamp (a constant ``--ema.decay`` pins both
    ends), ``update_after_step``, ``inv_gamma``, ``power``.
    """
    if found is None:
        return None
    saved, where = found
    pairs = {
        "--ema.min_decay (or --ema.decay)": (saved.clamp[0], schedule.clamp[0]),
        "--ema.max_decay (or --ema.decay)": (saved.clamp[1], schedule.clamp[1]),
        "--ema.update_after_step": (saved.update_after_step, schedule.update_after_step),
        "--ema.inv_gamma": (saved.inv_gamma, schedule.inv_gamma),
        "--ema.power": (saved.power, schedule.power),
    }
    changed = [f"{flag} {before!r} → {now!r}" for flag, (before, now) in pairs.items() if before != now]
    if not changed:
        return None
    return (
        f"{', '.join(changed)}: the EMA shadow was built with the values {where} holds; resume with those"
        " (a changed EMA schedule does not continue the saved run)"
    )
