"""Every precondition of a resume, as a list of pass / warn / fail checks.

The rule for severities: a check **fails** exactly when the training core's resume would stop
on it (a start-up refusal or a load error), and **warns** when the resume runs but not as an
uninterrupted run would have (another data split, another batch, precision changed, a
disagreeing config). ``verify-resume`` reports these checks; ``reshard-plan`` lists the failed
ones as what cannot work.

- :mod:`.state`: the files the loader reads - present, complete, covering the model;
- :mod:`.settings`: the resumed run's settings - topology, precision, PEFT base, data order.
"""

from __future__ import annotations

from ckpt_tools.check import Check
from ckpt_tools.resume.checks.settings import settings_checks
from ckpt_tools.resume.checks.state import state_checks
from ckpt_tools.resume.source import ResumeSource
from ckpt_tools.resume.target import ResumeTarget

__all__ = ["resume_checks"]


def resume_checks(source: ResumeSource, target: ResumeTarget, *, build: bool = False) -> list[Check]:
    """All checks, structural ones first (the first failure is usually the one to fix).

    A layout the trainer never resumes stops there: no setting makes it resumable. ``build``:
    also the trainer's own build before its first step (dataset, policy, load plan), which
    imports torch (:func:`ckpt_tools.train.preflight.build_checks`).
    """
    state = state_checks(source, target, build=build)
    if any(c.name == "layout" and c.failed for c in state):
        return state
    return [*state, *settings_checks(source, target)]
