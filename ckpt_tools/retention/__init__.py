"""Retention of a run's checkpoints: gather the facts, ask the rule, remove what it lets go.

The trainer (``--checkpoint.keep_last_n``, after each commit), ``ckpt-tools prune`` and
``inspect`` share this module; the decision itself is the pure
:func:`~ckpt_tools.format.rules.retention.retention_plan`. Torch-free.

A step is removed crash-safely: renamed out of the step-name space first (a hidden
``.NNNNNN.deleting-<pid>@<host>`` that no reader takes for a step, :func:`fsutil.deleting_name`),
then removed. A kill during the removal leaves that hidden leftover, never a half step under a
step's name; the next retention (or ``prune``) finishes it (:func:`finish_interrupted`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ckpt_tools.errors import CkptError
from ckpt_tools.format import layout
from ckpt_tools.format.record import read_training_step
from ckpt_tools.format.rules.retention import IN_USE, RetentionPlan, StepFate, retention_plan
from ckpt_tools.io.fsutil import deleting_name, find_leftovers, fsync_dir, remove_tree
from ckpt_tools.retention.lease import leased_step_names, remove_abandoned_leases

# A test (and a user studying a crash) can stop a removal between its rename and its rmtree.
PAUSE_ENV = "CKPT_TOOLS_RETENTION_PAUSE_S"


@dataclass(frozen=True)
class RunSteps:
    """What the rule needs to know about one checkpoints root, read off the disk."""

    root: Path
    steps: dict[int, Path]  # step number -> its directory
    last: int | None
    newest_resumable: int | None
    in_use: frozenset[int]

    def plan(self, keep_last_n: int) -> RetentionPlan:
        return retention_plan(
            list(self.steps),
            keep_last_n,
            last=self.last,
            newest_resumable=self.newest_resumable,
            in_use=self.in_use,
        )


def _resumable(step_dir: Path) -> bool:
    """A complete step a resume reads: its ``training_step.json`` parses (the record is written into
    the hidden partial directory, so a step under its own name always has one unless damaged)."""
    try:
        read_training_step(layout.StepPaths(step_dir).training_step)
    except CkptError:
        return False
    return True


def read_run_steps(checkpoints_root: Path) -> RunSteps:
    """The steps of ``checkpoints_root``, ``last``'s (CheckpointError for a hostile pointer file), the
    newest resumable one, and the ones a live reader holds."""
    steps = {int(p.name): p for p in layout.list_step_dirs(checkpoints_root)}
    last_dir = layout.resolve_last(checkpoints_root)
    last = None
    if last_dir is not None and last_dir.parent.resolve() == checkpoints_root.resolve():
        last = int(last_dir.name) if layout.is_step_dir_name(last_dir.name) else None
    newest = next((n for n in sorted(steps, reverse=True) if _resumable(steps[n])), None)
    leased = {int(name) for name in leased_step_names(checkpoints_root)}
    return RunSteps(checkpoints_root, steps, last, newest, frozenset(leased & set(steps)))


@dataclass
class RetentionOutcome:
    """What a retention did: the plan, the steps it removed, and those a reader took meanwhile."""

    facts: RunSteps  # what was on disk when the plan was made
    plan: RetentionPlan
    removed: list[int]
    taken_meanwhile: list[int]  # leased between the decision and the removal: kept
    notes: list[str]


def remove_step(step_dir: Path) -> bool:
    """Move ``step_dir`` out of the step-name space, re-check for a reader's lease, then remove it.

    Returns False (and puts the step back) when a reader took a lease in the meantime.
    """
    root = step_dir.parent
    aside = step_dir.with_name(deleting_name(step_dir.name))
    remove_tree(aside)  # this process's own earlier, interrupted attempt
    os.replace(step_dir, aside)
    fsync_dir(root)
    if step_dir.name in leased_step_names(root):
        os.replace(aside, step_dir)
        fsync_dir(root)
        return False
    pause = float(os.environ.get(PAUSE_ENV, "0") or 0)
    if pause > 0:
        time.sleep(pause)
    remove_tree(aside)
    return True


def finish_interrupted(checkpoints_root: Path) -> list[str]:
    """Remove the steps an interrupted removal left moved aside (their process gone), and the leases
    of readers killed outright; one note each."""
    notes = []
    for leftover in find_leftovers(checkpoints_root):
        if leftover.deleting and layout.is_step_dir_name(leftover.target) and leftover.abandoned:
            remove_tree(leftover.path)
            notes.append(f"finished removing {leftover.target}/, left by an interrupted removal")
    if remove_abandoned_leases(checkpoints_root):
        notes.append("removed the leases of readers that were killed")
    return notes


def apply_retention(checkpoints_root: Path, keep_last_n: int) -> RetentionOutcome:
    """Decide and remove, oldest first. The caller owns the run (its lock): no save can commit meanwhile."""
    notes = finish_interrupted(checkpoints_root)
    facts = read_run_steps(checkpoints_root)
    plan = facts.plan(keep_last_n)
    removed, taken = [], []
    for step in plan.removed:
        if remove_step(facts.steps[step]):
            removed.append(step)
        else:
            taken.append(step)
    return RetentionOutcome(facts, plan, removed, taken, notes)


def describe_fate(fate: StepFate, name: str) -> str:
    """``000004  kept: last, within the newest 2`` / ``000002  removed``."""
    return f"{name}  kept: {', '.join(fate.reasons)}" if fate.kept else f"{name}  removed"


__all__ = [
    "IN_USE",
    "PAUSE_ENV",
    "RetentionOutcome",
    "RunSteps",
    "apply_retention",
    "describe_fate",
    "finish_interrupted",
    "read_run_steps",
    "remove_step",
]
