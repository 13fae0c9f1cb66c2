"""A folder of saves as ``inspect`` reports it: a checkpoints root (its step dirs, ``last``, the
partial saves and leftovers, what retention would remove) or another trainer's folder of
``step-N/`` saves (torchtitan's). Every step is checked; the one a resume would read is
reported in detail, the others by their health.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ckpt_tools.check import Check
from ckpt_tools.errors import CheckpointError, CkptError
from ckpt_tools.format import layout as L
from ckpt_tools.inspect.checks import leftovers
from ckpt_tools.inspect.dcp import inspect_dcp
from ckpt_tools.inspect.report import InspectReport, RetentionView, StepSummary
from ckpt_tools.inspect.safetensors import inspect_index
from ckpt_tools.inspect.steps import inspect_step
from ckpt_tools.io.remote import remote_file

# What a root's report takes from the step it inspects in detail (its checks are taken prefixed).
ADOPTED = (
    "checkpoint",
    "step",
    "formats",
    "peft",
    "processors",
    "training_step",
    "topology",
    "batch",
    "legacy",
    "data_verified",
    "data_gb_per_s",
    "ema",
)


def inspect_root(root: Path, report: InspectReport, tensors: bool) -> None:
    """A checkpoints root: ``last``, the partial saves, every step; the step ``last`` names in detail."""
    steps = L.list_step_dirs(root)
    try:
        last = L.resolve_last(root)
        hostile = None
    except CheckpointError as e:  # a pointer file holding anything but a step dir's name
        last, hostile = None, str(e)
    report.partial_saves = [p.name for p in L.list_partial_dirs(root)]
    for name in report.partial_saves:
        report.checks.append(Check.warn("partial save", f"{name}: left by a save that did not complete"))
    leftovers(root, [root], report)
    _last_check(root, steps, last, hostile, report)
    if not steps:
        report.checks.append(Check.fail("steps", f"{root}: no complete step directory"))
        return
    target = last if last is not None and last in [s.resolve() for s in steps] else steps[-1]
    for step_dir in steps:
        sub = InspectReport(
            path=str(step_dir),
            kind=L.PathKind.STEP_DIR.value,
            values_checked=report.values_checked,
            data_checked=report.data_checked,
        )
        inspect_step(L.StepPaths(step_dir), sub, tensors and step_dir.resolve() == target.resolve())
        report.data_bytes += sub.data_bytes
        failed = sum(c.failed for c in sub.checks)
        report.steps.append(StepSummary(step_dir.name, L.StepPaths(step_dir).step, sub.healthy, failed))
        if step_dir.resolve() == target.resolve():
            _adopt(report, sub)
        elif failed:
            report.checks.append(Check.fail(f"step {step_dir.name}", f"{failed} failed checks (inspect it)"))
    report.inspected_step = target.name


def _last_check(root: Path, steps: list[Path], last: Path | None, hostile: str | None, report: InspectReport) -> None:
    """The ``last link`` check: a link or pointer file naming a step dir here (on the Hub, none needed)."""
    link = root / L.LAST_LINK
    if hostile is not None:
        report.checks.append(Check.fail("last link", hostile))
    elif link.is_symlink() or link.exists():
        ok = last is not None and last.parent.resolve() == root.resolve() and L.is_step_dir_name(last.name)
        pointer = L.last_is_pointer_file(root)
        report.last = (
            last.name
            if last is not None
            else os.readlink(link)
            if link.is_symlink()
            else L.read_last_pointer(link)
            if pointer
            else None
        )
        kind = " (pointer file)" if pointer else ""
        report.checks.append(
            Check.judge(
                "last link",
                ok,
                f"last -> {report.last}{kind}" if ok else f"last -> {report.last}{kind}: not a step dir here",
            )
        )
    elif steps and remote_file(root) is not None:
        shown = last.name if last is not None else None
        report.checks.append(
            Check.ok("last link", f"on the Hub, where an upload leaves 'last' out: the newest, {shown}")
        )
    elif steps:
        report.checks.append(Check.fail("last link", "no 'last' link next to the step dirs"))


def retention(root: Path, report: InspectReport, keep_last: int | None) -> None:
    """What retention would remove from ``root``, by the rule the trainer and ``prune`` apply."""
    from ckpt_tools.format.train_config import read_saved_config
    from ckpt_tools.retention import read_run_steps

    try:
        facts = read_run_steps(root)
    except CheckpointError:
        return  # a hostile `last`: its check already fails, and nothing could be removed
    source = "--keep-last"
    if keep_last is None and facts.last is not None:
        with contextlib.suppress(CkptError):
            config = read_saved_config(L.StepPaths(facts.steps[facts.last]).train_config)
            keep_last, source = (
                config.keep_last_n,
                f"{facts.steps[facts.last].name}/{L.PRETRAINED_MODEL_DIR}/{L.TRAIN_CONFIG}",
            )
    if keep_last is None or keep_last < 1:
        return
    plan = facts.plan(keep_last)
    report.retention = RetentionView(
        keep_last,
        source,
        [facts.steps[n].name for n in plan.removed],
        {facts.steps[f.step].name: list(f.reasons) for f in plan.kept},
    )


def inspect_trainer_root(root: Path, report: InspectReport, tensors: bool) -> None:
    """Another trainer's folder of ``step-N/`` saves (torchtitan's): every save checked, the newest in detail."""
    steps = L.list_trainer_steps(root)
    report.partial_saves = [p.name for p in L.incomplete_trainer_steps(root)]
    for name in report.partial_saves:
        report.checks.append(Check.warn("partial save", f"{name}: no .metadata - a save that did not complete"))
    if not steps:
        report.checks.append(Check.fail("steps", f"{root}: no complete step-N save"))
        return
    newest = steps[-1]
    for step_dir in steps:
        sub = InspectReport(path=str(step_dir), kind=L.PathKind.DCP_DIR.value, values_checked=report.values_checked)
        if (step_dir / L.DCP_METADATA).is_file():
            inspect_dcp(step_dir, step_dir.name, sub, tensors and step_dir == newest)
        else:  # a Hugging Face last step: model.safetensors.index.json and its shards
            inspect_index(step_dir / L.MODEL_WEIGHTS_INDEX, f"{step_dir.name}/{L.MODEL_WEIGHTS_INDEX}", sub, tensors)
        failed = sum(c.failed for c in sub.checks)
        report.steps.append(StepSummary(step_dir.name, L.trainer_step_number(step_dir), sub.healthy, failed))
        if step_dir == newest:
            report.checks.extend(sub.checks)
            report.weights, report.tensors, report.notes = sub.weights, sub.tensors, sub.notes
            report.nonfinite = sub.nonfinite
        elif failed:
            report.checks.append(Check.fail(f"step {step_dir.name}", f"{failed} failed checks (inspect it)"))
    report.inspected_step = newest.name


def _adopt(report: InspectReport, sub: InspectReport) -> None:
    """Take the inspected step's details into the root report (checks prefixed with its name)."""
    name = Path(sub.path).name
    report.checks.extend(Check(f"{name}: {c.name}", c.status, c.message) for c in sub.checks)
    for attr in ADOPTED:
        setattr(report, attr, getattr(sub, attr))
    report.weights, report.tensors, report.notes = sub.weights, sub.tensors, sub.notes
    report.leftovers += [f"{name}/{rel}" for rel in sub.leftovers]
    report.nonfinite = sub.nonfinite
