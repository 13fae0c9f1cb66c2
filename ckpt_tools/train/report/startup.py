"""Where a process's start-up goes: seconds from its creation to each phase before the first step.

A relaunched worker (torchrun's restart, ``--resume=auto``) spends its recovery here: the
imports, the process group (the rendezvous of the new workers), building the model and
optimizer, reading the checkpoint. The marks go out with the ``first_step`` event of
metrics.jsonl, so a recovery can be split into phases from the run's own log.
"""

from __future__ import annotations

import time

from ckpt_tools.train.report.procstats import seconds_since_process_start

_marks: dict[str, float] = {}


def mark(phase: str) -> None:
    """Record that ``phase`` ended now (the first time only)."""
    seconds = seconds_since_process_start()
    if seconds is not None:
        _marks.setdefault(phase, round(seconds, 3))


def marks() -> dict[str, float]:
    return dict(_marks)


def started_unix() -> float | None:
    """This process's creation as a Unix time (to line it up with events outside the process)."""
    seconds = seconds_since_process_start()
    return None if seconds is None else round(time.time() - seconds, 3)
