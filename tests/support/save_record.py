"""A trainer checkpoint as another producer would leave it: without the record of its save's files."""

from __future__ import annotations

from pathlib import Path

from ckpt_tools.format.layout import StepPaths


def without_save_record(step: Path) -> Path:
    """Remove ``save_files.json``: for tests of a check that must hold on checkpoints that carry none
    (LeRobot's, other producers'), whose damage the record would otherwise report first."""
    StepPaths(Path(step)).save_files.unlink()
    return step
