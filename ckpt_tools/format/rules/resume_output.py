"""Where a resume writes, and what it must not write over: decided before any process group exists.

A resume of step S writes into ``--output_dir``, which defaults to the run the checkpoint
belongs to (the directory holding its ``checkpoints/``: a copy of a run is its own run, see
:attr:`~ckpt_tools.format.train_config.SavedConfig.run_dir`). Two rules follow:

- writing anywhere else is said, in one line, before anything is written;
- the run saves steps S + save_freq, ... into that directory, renaming each save over a step
  dir of the same name. When step dirs after S are already there (a resume from an older
  checkpoint of the same run, or into another run), they would be replaced one by one, and
  ``last`` moved back to S and beyond - so the trainer refuses to start, naming them, unless
  ``--overwrite_checkpoints=true`` says to replace them.
"""

from __future__ import annotations

import os
from pathlib import Path

from ckpt_tools.format import layout
from ckpt_tools.format.layout import StepPaths

OVERWRITE_FLAG = "--overwrite_checkpoints"


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):
        return os.path.abspath(a) == os.path.abspath(b)


def elsewhere_notice(step: StepPaths, run_dir: Path | None, output_dir: Path) -> str | None:
    """One line when the resume of ``step`` writes into ``output_dir``, not the run it belongs to."""
    if run_dir is not None and _same_dir(run_dir, output_dir):
        return None
    origin = f"run {run_dir}" if run_dir is not None else f"{step.root} (not in a run's {layout.CHECKPOINTS_DIR}/)"
    return f"resuming step {step.root.name} of {origin} into --output_dir={output_dir}: the new checkpoints go there"


def newer_checkpoints(output_dir: Path, step: int) -> list[Path]:
    """The complete step dirs of ``output_dir`` after ``step``: what a resume from ``step`` would save over."""
    return [p for p in layout.list_step_dirs(output_dir / layout.CHECKPOINTS_DIR) if int(p.name) > step]


def overwrite_refusal(output_dir: Path, step: int, *, overwrite: bool) -> str | None:
    """Why a resume from ``step`` into ``output_dir`` must not start (None: nothing to overwrite, or allowed)."""
    newer = newer_checkpoints(output_dir, step)
    if not newer or overwrite:
        return None
    names = ", ".join(p.name for p in newer[:3]) + (f" (+{len(newer) - 3} more)" if len(newer) > 3 else "")
    return (
        f"--output_dir={output_dir}: holds checkpoints after step {step} ({names}) that this resume would"
        f" overwrite; resume from {newer[-1]} instead, choose another --output_dir, or pass"
        f" {OVERWRITE_FLAG}=true to replace them"
    )


def overwrite_notice(output_dir: Path, step: int, *, overwrite: bool) -> str | None:
    """The line a resume allowed to overwrite prints: which step dirs it will replace."""
    newer = newer_checkpoints(output_dir, step)
    if not newer or not overwrite:
        return None
    return (
        f"{OVERWRITE_FLAG}=true: the checkpoints after step {step} in {output_dir / layout.CHECKPOINTS_DIR}"
        f" ({', '.join(p.name for p in newer)}) are replaced where this run saves the same steps"
    )
