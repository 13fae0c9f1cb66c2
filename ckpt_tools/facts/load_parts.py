"""Whether a checkpoint can give the parts a new run loads from it (``--checkpoint.load_from`` +
``--checkpoint.load``), read from its files for the trainer and ``verify-resume --load``.

The names and flags are :mod:`ckpt_tools.format.rules.load_parts`'; each chosen part is judged
here by the rules of its files - present (the manifest), its save's (``save_files.json``), of one
step (the counters), with the run's hyper-parameters (the scheduler) - as those files say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ckpt_tools.errors import CkptError
from ckpt_tools.facts import consistency, load_plan, save_files, saved_hyperparameters
from ckpt_tools.format import manifest
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.record import TrainingStep
from ckpt_tools.format.rules import save_files as save_record
from ckpt_tools.format.rules.load_parts import LOAD_FLAG, MODEL, OPTIMIZER, SCHEDULER
from ckpt_tools.format.rules.startup import RunSettings


@dataclass(frozen=True)
class SourceCheck:
    """One part's verdict on a source checkpoint: None when the part can be loaded, else the line."""

    part: str
    problem: str | None
    reads: str  # what the load reads for it (for the report)


def source_checks(
    paths: StepPaths,
    record: TrainingStep,
    parts: Sequence[str],
    *,
    fp16: bool,
    settings: RunSettings | None = None,
) -> list[SourceCheck]:
    """Whether ``paths`` can give each of ``parts``: its container there, its files those its save wrote,
    and (when optimizer or scheduler state is chosen) its counters from the record's step and, given
    the new run's ``settings`` and the scheduler chosen, its saved hyper-parameters equal to the ones the
    run is configured with (the saved schedule goes on, as on a resume). The optimizer part alone is its
    state - moments and step counts - under this run's own hyper-parameters.

    ``fp16``: the new run has a loss scaler (only then is ``scaler`` read).
    """
    if record.peft:
        line = (
            f"{paths.root}: a LoRA checkpoint holds only its adapter, no model to start from: train the adapter"
            f" further with --resume=true --config_path={paths.root}, or start a new one with --policy.path=<its"
            " base> --peft.*"
        )
        return [SourceCheck(MODEL, line, "adapter only")]
    out = []
    damaged = _damaged_files(paths)
    for part in parts:
        inputs = manifest.part_containers(part, fp16=fp16)
        if part == MODEL:
            chosen = manifest.choose(manifest.weights_inputs(False), paths)
            problem = manifest.no_weights_reason(paths, False) if chosen is None else None
            if chosen is not None and problem is None and load_plan.saved_shapes(paths) is None:
                problem = f"{paths.root / chosen.path}: its tensor table cannot be read (a damaged header or metadata)"
            inputs = (chosen,) if chosen is not None else ()
        elif part == OPTIMIZER:
            chosen = manifest.choose(manifest.optimizer_inputs(), paths)
            problem = manifest.no_optimizer_reason(paths, bool(record.sharded)) if chosen is None else None
            inputs = (chosen,) if chosen is not None else ()
        else:
            missing = [p for p in inputs if not p.present(paths)]
            problem = f"{paths.root / missing[0].path}: missing ({LOAD_FLAG} asks for its {part})" if missing else None
        if problem is None:
            found = [line for rel, line in damaged if not rel or any(rel.startswith(p.path) for p in inputs)]
            problem = save_record.summary(paths, found) if found else None
        if problem is None and part in (OPTIMIZER, SCHEDULER):
            problem = consistency.inconsistency(paths, record)
        if problem is None and part == SCHEDULER and settings is not None:
            problem = saved_hyperparameters.mismatch(paths, settings)
        out.append(SourceCheck(part, problem, ", ".join(p.name for p in inputs) or "nothing (not this run's)"))
    return out


def source_refusal(
    paths: StepPaths,
    record: TrainingStep,
    parts: Sequence[str],
    *,
    fp16: bool,
    settings: RunSettings | None = None,
) -> str | None:
    """The first line :func:`source_checks` found (the trainer refuses with it), or None."""
    checks = source_checks(paths, record, parts, fp16=fp16, settings=settings)
    return next((c.problem for c in checks if c.problem), None)


def _damaged_files(paths: StepPaths) -> list[tuple[str, str]]:
    """(relative path, line) of every file that is not what its save wrote (nothing without a record)."""
    try:
        saved = save_record.read(paths)
    except CkptError as e:
        return [("", str(e))]
    if saved is None:
        return []
    return [(line.split(":", 1)[0], line) for line in save_files.problems(paths, saved)]


def initialized_from(paths: StepPaths, record: TrainingStep, parts: Sequence[str]) -> dict[str, object]:
    """What ``training_step.json`` records of the source: its path, step, save id and the parts loaded."""
    try:
        saved = save_record.read(paths)
    except CkptError:
        saved = None
    save_id = saved.save_id if saved is not None else None
    return {"path": str(paths.root), "step": record.step, "save_id": save_id, "parts": list(parts)}
