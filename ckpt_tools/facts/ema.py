"""The EMA schedule a checkpoint was trained with, read for :func:`ckpt_tools.format.ema.schedule_change`.

From ``ema_state.pt`` (diffusers' numbers, read through the restricted unpickler) or, for a
sharded save, from the copy of ``train_config.json`` its save recorded.
"""

from __future__ import annotations

from ckpt_tools.errors import CkptError
from ckpt_tools.facts.ema_state import read_ema_state_settings
from ckpt_tools.format import ema
from ckpt_tools.format.ema import EmaSchedule, schedule_from_config
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.rules import save_files


def saved_schedule(paths: StepPaths) -> tuple[EmaSchedule, str] | None:
    """The EMA settings the checkpoint was trained with, and where they were read, or None (nothing says).

    ``ema_state.pt`` holds diffusers' numbers (the clamp, ``update_after_step``, ``inv_gamma``,
    ``power``) beside the shadow; a sharded save has none, and the copy of ``train_config.json``
    the save recorded (:mod:`ckpt_tools.format.rules.save_files`) says them - never the file on
    disk, which a user may have edited since.
    """
    if paths.ema_state.is_file():
        numbers = read_ema_state_settings(paths.ema_state)
        low, high = numbers.get("min_decay"), numbers.get("decay")
        return schedule_from_config(
            {**numbers, "decay": None, "min_decay": low, "max_decay": high}
        ), paths.ema_state.name
    try:
        saved = save_files.read(paths)
    except CkptError:
        return None
    kept = saved.files.get(save_files.KEPT_CONTENT) if saved is not None else None
    content = kept.content if kept is not None else None
    if not isinstance(content, dict) or not isinstance(content.get("ema"), dict):
        return None
    return schedule_from_config(content["ema"]), f"{save_files.KEPT_CONTENT} as saved"


def schedule_change(paths: StepPaths, enabled: bool | None, schedule: EmaSchedule | None) -> str | None:
    """The resumed ``--ema.*`` values that differ from those ``paths`` was trained with, as one line, or None.

    Nothing is read for a run without EMA or without a schedule to compare.
    """
    if not enabled or schedule is None:
        return None
    return ema.schedule_change(saved_schedule(paths), schedule)
