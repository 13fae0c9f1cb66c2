"""Which checkpoint steps a retention of the newest K removes, which stay, and why each stays.

Long runs that save often fill the disk (torchtitan's ``keep_latest_k``, accelerate's
``total_limit``). ``--checkpoint.keep_last_n`` in the trainer, ``ckpt-tools prune`` and
``inspect`` all decide with :func:`retention_plan`, a pure function of facts their callers
gather: the step numbers present, the one ``last`` points at, the newest resumable one, the
ones a reader has marked in use. A step is kept when any of these holds; every other step goes:

- ``last``: the step a resume reads must never go;
- ``newest resumable``: the newest complete step stays even where ``last`` lags behind it
  (a save stopped between its rename and moving ``last``);
- ``in use``: a reader (``convert-dcp``, ``push``, ``verify-resume``...) holds a lease on it;
- ``within K``: among the K highest step numbers.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

LAST = "last"
NEWEST_RESUMABLE = "newest resumable"
IN_USE = "in use"
WITHIN_K = "within the newest {k}"


@dataclass(frozen=True)
class StepFate:
    """One step's verdict: kept (with every reason that keeps it) or removed (no reason)."""

    step: int
    reasons: tuple[str, ...] = ()

    @property
    def kept(self) -> bool:
        return bool(self.reasons)


@dataclass(frozen=True)
class RetentionPlan:
    """The verdict for every step, oldest first."""

    keep_last_n: int
    fates: tuple[StepFate, ...] = field(default_factory=tuple)

    @property
    def removed(self) -> list[int]:
        return [f.step for f in self.fates if not f.kept]

    @property
    def kept(self) -> list[StepFate]:
        return [f for f in self.fates if f.kept]


def retention_plan(
    steps: Sequence[int],
    keep_last_n: int,
    *,
    last: int | None,
    newest_resumable: int | None,
    in_use: Collection[int] = (),
) -> RetentionPlan:
    """Decide every step's fate under ``keep_last_n`` (≥ 1).

    ``last``: the step ``last`` points at (None: no usable ``last``); ``newest_resumable``: the
    highest step a resume could read (None: none); ``in_use``: steps a live reader holds. With
    no usable ``last`` nothing is removed: which step a resume would take cannot be told.
    """
    if keep_last_n < 1:
        raise ValueError(f"keep_last_n={keep_last_n}: must be ≥ 1")
    ordered = sorted(set(steps))
    newest = set(ordered[-keep_last_n:])
    within = WITHIN_K.format(k=keep_last_n)
    fates = []
    for step in ordered:
        reasons = []
        if step == last or last is None:
            reasons.append(LAST if step == last else "no usable last")
        if step == newest_resumable:
            reasons.append(NEWEST_RESUMABLE)
        if step in in_use:
            reasons.append(IN_USE)
        if step in newest:
            reasons.append(within)
        fates.append(StepFate(step, tuple(reasons)))
    return RetentionPlan(keep_last_n, tuple(fates))
