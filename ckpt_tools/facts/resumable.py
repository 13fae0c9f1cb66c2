"""What a LeRobot checkpoint's state files say of their writer, read for :mod:`ckpt_tools.format.rules.resumable`.

``ckpt-train`` refuses a checkpoint LeRobot wrote, naming what in it is LeRobot's: its flat
optimizer state keyed by parameter name or by position, its RNG state one process's
generators. Both are read from the safetensors headers, only where the refusal names them.
"""

from __future__ import annotations

from ckpt_tools.errors import CkptError
from ckpt_tools.facts.record import flat_optimizer_by_name
from ckpt_tools.format import lerobot
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.record import TrainingStep
from ckpt_tools.format.rules import resumable
from ckpt_tools.format.rules.resumable import LerobotState, Trainer
from ckpt_tools.st.header import read_header


def unresumable_reason(
    paths: StepPaths, record: TrainingStep, *, has_optimizer: bool, trainer: Trainer = Trainer.CKPT_TRAIN
) -> str | None:
    """One line saying why ``trainer`` can never resume ``paths``, or None when its layout can be
    (:func:`ckpt_tools.format.rules.resumable.unresumable_reason`, given what the files say)."""
    state = lerobot_state(paths) if resumable.needs_lerobot_state(paths, record, trainer) else LerobotState()
    return resumable.unresumable_reason(
        paths, record, has_optimizer=has_optimizer, trainer=trainer, lerobot_state=state
    )


def lerobot_state(paths: StepPaths) -> LerobotState:
    """What the flat optimizer state's keys and the RNG state's say (nothing, where unreadable)."""
    return LerobotState(flat_optimizer_by_name(paths), _lerobot_rng(paths))


def _lerobot_rng(paths: StepPaths) -> bool:
    try:
        return all(k in read_header(paths.rng_state).entries for k in lerobot.RNG_KEYS)
    except CkptError:
        return False
