"""``training_state/scheduler_state.json``, read for the rules that compare its counters and its lr."""

from __future__ import annotations

from typing import Any

from ckpt_tools.errors import CkptError
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.io.safe_read import read_json_file


def read_scheduler_state(paths: StepPaths) -> dict[str, Any] | None:
    """The LR scheduler's saved state (None: missing or unreadable - the scheduler check says so)."""
    try:
        state: dict[str, Any] = read_json_file(paths.scheduler_state, want_object=True)
    except (CkptError, OSError, ValueError):
        return None
    return state
