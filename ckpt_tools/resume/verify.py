"""``verify_resume``: will ``--resume=true`` from this checkpoint work on that target? A CI gate.

Runs every check of :mod:`ckpt_tools.resume.checks` - files present and complete, metadata
covering the model, a resumable layout, the target's start-up rules, precision, PEFT base,
dataset, data order - and says ``resumable`` only when none failed (and, with ``strict``, none
warned). It reads metadata and headers only, so it takes a fraction of a second on any size.

The target is what the resume command would run with: the checkpoint's own
``train_config.json`` (or ``config``, a train_config.json the next run will use) with the given
flags on top, on ``nproc`` processes (default: the saved world size).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from ckpt_tools.check import FAIL, WARN, Check, Subject
from ckpt_tools.errors import CkptError, UsageError
from ckpt_tools.facts import load_parts as load_sources
from ckpt_tools.facts.record import read_record
from ckpt_tools.format.layout import resolve_step
from ckpt_tools.format.rules import load_parts
from ckpt_tools.format.train_config import SavedConfig, read_saved_config
from ckpt_tools.resume.checks import resume_checks
from ckpt_tools.resume.source import load_source
from ckpt_tools.resume.target import TargetRequest, resolve_target


@dataclass
class VerifyReport:
    checkpoint: str  # the step dir read: absolute, `last` followed (as inspect's, check.Subject)
    step: int | None
    topology: str | None  # the saved topology, described (as inspect's)
    target: str | None  # the target topology, described (None: it does not resolve)
    strict: bool
    checks: list[Check] = field(default_factory=list)
    trainer: str | None = None  # whose resume is predicted: ckpt-train or lerobot-train
    load: tuple[str, ...] | None = None  # verify_load: the parts a new run would start from (not a resume)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL or (self.strict and c.status == WARN)]

    @property
    def resumable(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """What ``verify-resume --json`` prints; each check is ``{"name", "status", "message"}`` as in ``inspect``."""
        return {
            "checkpoint": self.checkpoint,
            "step": self.step,
            "topology": self.topology,
            "target": self.target,
            "strict": self.strict,
            "trainer": self.trainer,
            "resumable": self.resumable if self.load is None else None,
            "load": list(self.load) if self.load is not None else None,
            "loadable": self.resumable if self.load is not None else None,
            "checks": [c.to_dict() for c in self.checks],
        }


def verify_resume(
    checkpoint: str | os.PathLike[str],
    request: TargetRequest | None = None,
    *,
    config: str | os.PathLike[str] | None = None,
    strict: bool = False,
    build: bool = False,
) -> VerifyReport:
    """Check every precondition of resuming ``checkpoint`` as ``request`` describes the resumed run.

    ``request`` holds the resume command's overrides (None: none); what it leaves None keeps
    the saved config's value - or ``config``'s, a train_config.json the next run will use.
    Without ``nproc``, an explicit ``R×S`` stands for the process count. Raises
    :class:`~ckpt_tools.errors.UsageError` for impossible values and
    :class:`~ckpt_tools.errors.CheckpointError` when ``checkpoint`` is not a checkpoint at all
    (or ``config`` is unreadable); a checkpoint that is there but broken yields failed checks.
    ``build``: also run the trainer's build before its first step (dataset, the policy on the
    meta device, the weights against it) - it imports torch where installed, which the command
    line does by default (``--skip-build``) and a library caller asks for.
    """
    request = request or TargetRequest()
    target_config = read_saved_config(config) if config is not None else None
    if request.nproc is None:
        request = replace(request, nproc=_implied_nproc(request.dp_replicate, request.dp_shard, target_config))
    request.check()
    paths = resolve_step(checkpoint)
    subject = Subject.of(paths.root, None)
    report = VerifyReport(subject.checkpoint or str(paths.root), subject.step, None, None, strict=strict)
    try:
        source = load_source(paths)
    except CkptError as e:
        report.checks.append(Check.fail("training-step", str(e)))
        return report
    subject = Subject.of(paths.root, source.record)
    report.step, report.topology = subject.step, subject.topology
    target = resolve_target(
        target_config or source.config, source.record, request, paths=source.paths, trainer=source.trainer
    )
    report.target = target.topology.describe() if target.topology else None
    report.trainer = target.trainer.value
    report.checks = resume_checks(source, target, build=build)
    if source.record.initialized_from is not None:
        report.checks.append(_initialized_from_check(source.record.initialized_from))
    return report


def verify_load(checkpoint: str | os.PathLike[str], load: str | None, *, fp16: bool = False) -> VerifyReport:
    """Would ``ckpt-train --checkpoint.load_from=CHECKPOINT --checkpoint.load=LOAD`` start? (not a resume).

    The checks are the trainer's own start-up rule for the parts chosen
    (:func:`ckpt_tools.facts.load_parts.source_checks`), one per part: only those parts'
    files are judged, so a checkpoint whose optimizer state is damaged passes for ``model``.
    ``fp16``: the new run has a loss scaler (``scaler`` is read only then). Raises
    :class:`~ckpt_tools.errors.UsageError` for an unknown part name.
    """
    try:
        parts = load_parts.parse(load)
    except ValueError as e:
        raise UsageError(str(e).replace(load_parts.LOAD_FLAG, "--load")) from None
    paths = resolve_step(checkpoint)
    subject = Subject.of(paths.root, None)
    report = VerifyReport(subject.checkpoint or str(paths.root), subject.step, None, "a new run (any topology)", False)
    report.load = parts
    try:
        record = read_record(paths)
    except CkptError as e:
        report.checks.append(Check.fail("training-step", str(e)))
        return report
    subject = Subject.of(paths.root, record)
    report.step, report.topology = subject.step, subject.topology
    report.checks.append(Check.ok("training-step", f"step {record.step}"))
    for found in load_sources.source_checks(paths, record, parts, fp16=fp16):
        name = f"load-{found.part}"
        report.checks.append(
            Check.fail(name, found.problem) if found.problem else Check.ok(name, f"reads {found.reads}")
        )
    if record.initialized_from is not None:
        report.checks.append(_initialized_from_check(record.initialized_from))
    return report


def _initialized_from_check(initialized: dict[str, object]) -> Check:
    """Where the run that wrote a checkpoint took its starting parts from (informational)."""
    return Check.ok("initialized-from", f"this run started at step 0 from {load_parts.describe(initialized)}")


def _implied_nproc(dp_replicate: int | None, dp_shard: int | None, config: SavedConfig | None) -> int | None:
    """The process count an explicit ``R×S`` (flags, or a given config) stands for; None: the saved one."""
    r = dp_replicate if dp_replicate is not None else (config.dp_replicate if config else None)
    s = dp_shard if dp_shard is not None else (config.dp_shard if config else None)
    if dp_replicate is None and dp_shard is None and config is None:
        return None
    if r is not None and s is not None and r > 0 and s > 0 and r * s > 1:
        return r * s
    return None
