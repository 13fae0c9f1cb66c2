"""Whether every part of a checkpoint belongs to the one step it claims, decided once for trainer and tools.

A checkpoint is several files written by one save, and nothing but their counters ties them
together: a ``training_step.json`` copied from another step, or an ``optimizer_0/`` left from
an earlier save, loads without an error and silently continues from a state that never
existed. So before a resume every counter is compared with the record's ``step``:

- the step directory's name (``000004``) - the record's ``step``;
- the optimizer state's Adam ``step`` counters (flat ``optimizer_state.safetensors`` or DCP
  ``optimizer_0/``, read torch-free) - the record's ``adam_step``, which the trainer saves
  next to them; a record without one (older trainers) only bounds them by ``optimizer_steps``
  (an fp16 run's scaler may have skipped updates, which Adam does not count); a LeRobot record
  counts neither, and bounds them by ``step`` (LeRobot updates at most once per loop step);
- the LR scheduler's ``last_epoch`` and ``_step_count`` - the record's ``step`` and ``step + 1``
  (the trainer steps it once per loop step, and torch steps it once when it is built);
- within the record: ``optimizer_steps`` ≤ ``step``, and the sampler position
  ``epoch × dataset_size + offset`` = ``samples_seen``.

A part that cannot be read is not compared here: the check that reads it for the resume
reports it. The counters are read by :mod:`ckpt_tools.facts.consistency`; this module judges
them. The trainer refuses an inconsistent checkpoint before any process group exists
(``ckpt_tools/train/checkpoint/load.py``); ``verify-resume`` and ``reshard-plan`` fail its
``consistency`` check with the same line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.record import TrainingStep


@dataclass(frozen=True)
class AdamSteps:
    """The Adam ``step`` counter of every parameter in the optimizer state the loader reads."""

    path: Path  # optimizer_0/ or optimizer_state.safetensors
    steps: dict[str, float]  # parameter name -> its counter


@dataclass(frozen=True)
class StepCounters:
    """What each part of a checkpoint says about its step (None: the part does not say, or was unreadable)."""

    paths: StepPaths
    record: TrainingStep
    adam: AdamSteps | None
    scheduler: dict[str, Any] | None


def problems(counters: StepCounters) -> list[str]:
    """Every disagreement, one line each, naming the file and the two values."""
    paths, record = counters.paths, counters.record
    out = []
    if paths.step is not None and paths.step != record.step:
        out.append(f"{paths.training_step}: step {record.step}, in step directory {paths.root.name}")
    if record.optimizer_steps is not None and record.optimizer_steps > record.step:
        out.append(f"{paths.training_step}: {record.optimizer_steps} optimizer updates in {record.step} steps")
    sampler = record.sampler
    if sampler is not None and sampler.dataset_size is not None and record.samples_seen is not None:
        position = sampler.epoch * sampler.dataset_size + sampler.offset
        if position != record.samples_seen:
            out.append(
                f"{paths.training_step}: the sampler is at sample {position} (epoch {sampler.epoch}, offset"
                f" {sampler.offset} of {sampler.dataset_size}), samples_seen says {record.samples_seen}"
            )
    if counters.adam is not None:
        out += _adam_problems(counters.adam, record)
    if counters.scheduler is not None:
        out += _scheduler_problems(counters.scheduler, paths, record)
    return out


def summary(found: list[str]) -> str:
    """The one line for :func:`problems`' findings (the first, and how many more)."""
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    return f"{found[0]}{more} - the parts of this checkpoint are not from one step; it cannot be resumed"


def describe(counters: StepCounters) -> str:
    """What was compared, for a passing check: ``step 4: record, directory name, Adam step (48 parameters), ...``."""
    parts = ["record"] + (["directory name"] if counters.paths.step is not None else [])
    if counters.adam is not None and counters.adam.steps:
        parts.append(f"Adam step ({len(counters.adam.steps)} parameters)")
    if counters.scheduler is not None:
        parts.append("scheduler")
    return f"step {counters.record.step}: {', '.join(parts)} agree"


# ---------------------------------------------------------------------- the optimizer


def _adam_problems(adam: AdamSteps, record: TrainingStep) -> list[str]:
    if not adam.steps:
        return []
    for name, value in adam.steps.items():
        if not math.isfinite(value) or value < 0 or value != int(value):
            return [f"{adam.path}: Adam step {value} of {name} is not a count of updates"]
    name, top = max(adam.steps.items(), key=lambda item: item[1])
    top_int = int(top)
    if record.adam_step is not None:
        if top_int != record.adam_step:
            return [
                f"{adam.path}: Adam step {top_int} ({name}), training_step.json says {record.adam_step}"
                f" (step {record.step}): the optimizer state is from another step"
            ]
    elif record.optimizer_steps is not None and top_int > record.optimizer_steps:
        return [
            f"{adam.path}: Adam step {top_int} ({name}), more than the {record.optimizer_steps} optimizer updates"
            f" training_step.json records (step {record.step}): the optimizer state is from another step"
        ]
    elif record.optimizer_steps is None and record.schema.lerobot and top_int > record.step:
        return [
            f"{adam.path}: Adam step {top_int} ({name}), more updates than the {record.step} steps"
            " training_step.json records: the optimizer state is from another step"
        ]
    return []


# ---------------------------------------------------------------------- the LR scheduler


def _scheduler_problems(state: dict[str, Any], paths: StepPaths, record: TrainingStep) -> list[str]:
    out = []
    for key, expected in (("last_epoch", record.step), ("_step_count", record.step + 1)):
        value = state.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value != expected:
            out.append(
                f"{paths.scheduler_state}: {key} {value}, step {record.step} needs {expected}:"
                " the scheduler state is from another step"
            )
    return out[:1]
