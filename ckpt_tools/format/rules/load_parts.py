"""Starting a new run from some parts of a checkpoint (``--checkpoint.load_from`` + ``--checkpoint.load``).

Fine-tuning from a checkpoint usually wants its weights and nothing else: a fresh optimizer,
schedule, generators and data order, at step 0, in a new output directory. The parts are named
as the training core's save/load pairs name them (:mod:`ckpt_tools.train.checkpoint.parts`):
``model``, ``optimizer``, ``scheduler``, ``scaler``, ``rng``; ``all`` is a resume's set.

Defined once, torch-free, for the trainer (its start-up and its load) and ``verify-resume
--load`` (which judges a checkpoint for such a start): which names are valid, which files each
part reads (the manifest's containers), and whether a checkpoint can give the parts chosen. A
part not chosen is never read, so a checkpoint whose optimizer state is damaged still starts a
weights-only run, though it cannot be resumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ckpt_tools.errors import CkptError
from ckpt_tools.format import manifest
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.record import TrainingStep
from ckpt_tools.format.rules import consistency, load_plan, save_files, saved_hyperparameters
from ckpt_tools.format.rules.run_settings import RunSettings

MODEL, OPTIMIZER, SCHEDULER, SCALER, RNG = "model", "optimizer", "scheduler", "scaler", "rng"
PART_NAMES = (MODEL, OPTIMIZER, SCHEDULER, SCALER, RNG)
ALL = "all"
DEFAULT = (MODEL,)  # --checkpoint.load_from without --checkpoint.load: weights only
LOAD_FLAG, LOAD_FROM_FLAG = "--checkpoint.load", "--checkpoint.load_from"


def parse(text: str | None) -> tuple[str, ...]:
    """The parts ``--checkpoint.load`` names, in :data:`PART_NAMES` order (None: the default, weights only).

    Raises :class:`ValueError` with the one line that refuses an unknown name or an empty list.
    """
    if text is None:
        return DEFAULT
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"{LOAD_FLAG}={text}: name at least one part ({valid_names()})")
    if ALL in names:
        return resume_set()
    unknown = [n for n in names if n not in PART_NAMES]
    if unknown:
        raise ValueError(f"{LOAD_FLAG}={text}: unknown part {', '.join(unknown)} (choose from {valid_names()})")
    return tuple(n for n in PART_NAMES if n in names)


def valid_names() -> str:
    return ", ".join((*PART_NAMES, ALL))


def resume_set() -> tuple[str, ...]:
    """What ``all`` means: every part a resume restores (the loss scaler only where the run has one)."""
    return PART_NAMES


def setting_problems(
    load_from: str | None, load: str | None, *, resume: bool, peft: bool, policy_path: str | None
) -> list[str]:
    """The start-up refusals of these flags, each one line naming the flag (the trainer and the tools alike)."""
    if load_from is None:
        return [f"{LOAD_FLAG}={load} needs {LOAD_FROM_FLAG}=PATH (the checkpoint to load it from)"] if load else []
    out = []
    try:
        parse(load)
    except ValueError as e:
        out.append(str(e))
    if resume:
        out.append(
            f"{LOAD_FROM_FLAG} starts a new run at step 0 from a checkpoint's parts; --resume=true continues"
            " its own: pass one of them"
        )
    if peft:
        out.append(
            f"{LOAD_FROM_FLAG} with --peft.*: a LoRA run's base comes from --policy.path, which reads a"
            f" checkpoint's weights too: pass --policy.path={load_from} instead"
        )
    elif policy_path:
        out.append(f"{LOAD_FROM_FLAG} and --policy.path both give the weights: pass one of them")
    return out


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
        inputs = containers(part, fp16=fp16)
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
            problem = save_files.summary(paths, found) if found else None
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


def containers(part: str, *, fp16: bool) -> tuple[manifest.Part, ...]:
    """The manifest's parts a load of ``part`` may read (the weights and optimizer: whichever is present)."""
    return {
        MODEL: manifest.weights_inputs(False),
        OPTIMIZER: manifest.optimizer_inputs(),
        SCHEDULER: (manifest.SCHEDULER_STATE,),
        SCALER: (manifest.SCALER_STATE,) if fp16 else (),
        RNG: (manifest.RNG_STATE,),
    }[part]


def _damaged_files(paths: StepPaths) -> list[tuple[str, str]]:
    """(relative path, line) of every file that is not what its save wrote (nothing without a record)."""
    try:
        saved = save_files.read(paths)
    except CkptError as e:
        return [("", str(e))]
    if saved is None:
        return []
    return [(line.split(":", 1)[0], line) for line in save_files.problems(paths, saved)]


def initialized_from(paths: StepPaths, record: TrainingStep, parts: Sequence[str]) -> dict[str, object]:
    """What ``training_step.json`` records of the source: its path, step, save id and the parts loaded."""
    try:
        saved = save_files.read(paths)
    except CkptError:
        saved = None
    save_id = saved.save_id if saved is not None else None
    return {"path": str(paths.root), "step": record.step, "save_id": save_id, "parts": list(parts)}


def describe(initialized: dict[str, object]) -> str:
    """One line for inspect, verify-resume and the start-up: where a run's weights came from."""
    parts = initialized.get("parts")
    names = ",".join(str(p) for p in parts) if isinstance(parts, list) else "?"
    save_id = initialized.get("save_id")
    saved = f", save {str(save_id)[:12]}" if save_id else ""
    return f"{initialized.get('path')} (step {initialized.get('step')}{saved}): {names}"
