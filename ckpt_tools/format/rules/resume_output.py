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

A resume of a run that already reached ``--steps`` (the resumed step is at or past it, and the
output dir holds that step's checkpoint) has nothing to do: it says so in one line and writes
nothing (:func:`nothing_to_do`). Into another output dir it writes that final checkpoint there.

One case is not refused: ``last`` still points at S and exactly one complete step dir follows
it. That is what a save killed between renaming its directory into place and moving ``last``
leaves, and a restart resumes from ``last``: it goes on (as it always did, re-saving that
step) and says so, rather than stopping every automatic restart after such a crash.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ckpt_tools.format import layout
from ckpt_tools.format.layout import StepPaths

OVERWRITE_FLAG = "--overwrite_checkpoints"


@dataclass(frozen=True)
class OutputCheck:
    """The verdict on a resume's output dir: a refusal (the one line), or the lines to print first."""

    refusal: str | None = None
    notices: tuple[str, ...] = ()


def check_output(step: StepPaths, record_step: int, output_dir: Path, *, overwrite: bool) -> OutputCheck:
    """Whether the resume of ``step`` (the record's ``record_step``) may write into ``output_dir``."""
    notices = []
    run_dir = step.run_dir
    if run_dir is None or not _same_dir(run_dir, output_dir):
        origin = f"run {run_dir}" if run_dir is not None else f"{step.root} (not in a run's {layout.CHECKPOINTS_DIR}/)"
        notices.append(
            f"resuming step {step.root.name} of {origin} into --output_dir={output_dir}: the new checkpoints go there"
        )
    root = output_dir / layout.CHECKPOINTS_DIR
    newer = newer_checkpoints(output_dir, record_step)
    names = ", ".join(p.name for p in newer[:3]) + (f" (+{len(newer) - 3} more)" if len(newer) > 3 else "")
    if newer and overwrite:
        notices.append(
            f"{OVERWRITE_FLAG}=true: the checkpoints after step {record_step} in {root} ({names})"
            " are replaced where this run saves the same steps"
        )
    elif newer and _interrupted_commit(root, step, newer):
        notices.append(
            f"{newer[0]} is complete but {root / layout.LAST_LINK} points at step {record_step} (a save stopped"
            f" between its rename and moving {layout.LAST_LINK}): this resume saves that step again, over it"
        )
    elif newer:
        return OutputCheck(
            f"--output_dir={output_dir}: holds checkpoints after step {record_step} ({names}) that this resume"
            f" would overwrite; resume from {newer[-1]} instead, choose another --output_dir, or pass"
            f" {OVERWRITE_FLAG}=true to replace them"
        )
    return OutputCheck(notices=tuple(notices))


def new_run_refusal(output_dir: Path) -> str | None:
    """Why a new run (no resume) must not start in ``output_dir``: it holds complete checkpoints.

    Only complete step dirs count; anything else a run leaves before its first save is kept
    and appended to, or replaced where it is an unfinished save (never a checkpoint).
    """
    if not layout.list_step_dirs(output_dir / layout.CHECKPOINTS_DIR):
        return None
    return (
        f"--output_dir={output_dir}: already holds checkpoints; pass --resume=true"
        " --config_path=... to continue, or choose another --output_dir"
    )


@dataclass(frozen=True)
class AutoResume:
    """What ``--resume=auto`` does in an output dir: resume ``step_dir``, or (None) start a new run."""

    step_dir: Path | None
    line: str  # the one line the run says at start-up
    refusal: str | None = None


def auto_resume(output_dir: Path) -> AutoResume:
    """``--resume=auto``: the step ``<output_dir>/checkpoints/last`` points at, else a new run.

    Read from the files alone, so every rank reading the same (shared) output dir decides the
    same; the trainer checks that they did once the process group exists. Complete step dirs
    without a usable ``last`` are refused as a new run into them is: which one to continue is
    the user's choice (``--resume=true``), not a guess.
    """
    root = output_dir / layout.CHECKPOINTS_DIR
    last = layout.resolve_last(root)
    if last is not None:
        step = StepPaths(last).step
        shown = last.name if step is None else str(step)
        line = (
            f"--resume=auto: resuming automatically from step {shown} ({last}, where {root / layout.LAST_LINK} points)"
        )
        return AutoResume(last, line)
    refusal = new_run_refusal(output_dir)
    if refusal is not None:
        return AutoResume(None, "", f"--resume=auto: {root} has no usable {layout.LAST_LINK}; {refusal}")
    return AutoResume(None, f"--resume=auto: no complete checkpoint in {root}: starting a new run")


def saved_step_dir(output_dir: Path, step: int) -> Path | None:
    """The complete checkpoint of ``step`` in ``output_dir`` (None: there is none)."""
    return next((p for p in layout.list_step_dirs(output_dir / layout.CHECKPOINTS_DIR) if int(p.name) == step), None)


def nothing_to_do(output_dir: Path, record_step: int, steps: int) -> str | None:
    """The line a resume of step ``record_step`` ends with when the run already reached ``--steps``.

    None: there is work - steps left, or an output dir without that checkpoint (the resume then
    saves it there: a resume into a new dir, to change the format or the layout, say).
    """
    if record_step < steps:
        return None
    saved = saved_step_dir(output_dir, record_step)
    if saved is None:
        return None
    return (
        f"nothing to do: the run is at step {record_step} and --steps={steps} ({saved} holds it);"
        f" pass --steps above {record_step} to train further"
    )


def newer_checkpoints(output_dir: Path, step: int) -> list[Path]:
    """The complete step dirs of ``output_dir`` after ``step``: what a resume from ``step`` would save over."""
    return [p for p in layout.list_step_dirs(output_dir / layout.CHECKPOINTS_DIR) if int(p.name) > step]


def _interrupted_commit(root: Path, step: StepPaths, newer: list[Path]) -> bool:
    """``last`` still at the resumed step and one step dir after it: a commit cut off before moving ``last``."""
    last = layout.resolve_last(root)
    return len(newer) == 1 and last is not None and _same_dir(last, step.root)


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):
        return os.path.abspath(a) == os.path.abspath(b)
