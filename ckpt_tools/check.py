"""One check result, shared by ``inspect``, ``verify-resume`` and ``reshard-plan``.

A check has a stable ``name``, a ``status`` - ``pass``, ``warn`` or ``fail`` - and a one-line
``message`` written for the person at the terminal. Every command's ``--json`` output shows a
check the same way, ``{"name": ..., "status": ..., "message": ...}`` (:meth:`Check.to_dict`),
so a CI script reads the health of a checkpoint and the verdict on a resume with one parser.

What the statuses mean is each command's: ``inspect`` fails a check when the checkpoint is
broken and warns when it is loadable but worth knowing about; ``verify-resume`` fails a check
exactly when the resume would stop on it.

Both reports also say which checkpoint they are about the same way (:class:`Subject`):
``checkpoint`` (the step dir read, ``last`` followed), ``step`` and ``topology``, so a script
that asks ``inspect`` about ``.../last`` and ``verify-resume`` about it reads the same values
under the same names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckpt_tools.format.record import TrainingStep

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass(frozen=True)
class Check:
    name: str  # stable identifier, e.g. "weights", "rng-state", "pytorch_model_fsdp_0/.metadata"
    status: str  # pass | warn | fail
    message: str  # one line, written for the person at the terminal

    @classmethod
    def ok(cls, name: str, message: str) -> Check:
        return cls(name, PASS, message)

    @classmethod
    def warn(cls, name: str, message: str) -> Check:
        return cls(name, WARN, message)

    @classmethod
    def fail(cls, name: str, message: str) -> Check:
        return cls(name, FAIL, message)

    @classmethod
    def judge(cls, name: str, passed: bool, message: str, *, otherwise: str = FAIL) -> Check:
        """``pass`` when ``passed``, else ``otherwise`` (``fail``, or ``warn`` for what is only worth knowing)."""
        return cls(name, PASS if passed else otherwise, message)

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "message": self.message}


@dataclass(frozen=True)
class Subject:
    """The checkpoint a report is about, as ``inspect --json`` and ``verify-resume --json`` both give it."""

    checkpoint: str | None  # the step directory read: absolute, `last` followed (None: the path is in none)
    step: int | None  # from the step dir's name, else training_step.json's (None: neither says)
    topology: str | None  # the saved topology in one line (None: training_step.json does not say)

    @classmethod
    def of(cls, step_dir: Path | None, record: TrainingStep | None) -> Subject:
        from ckpt_tools.format.layout import is_step_dir_name

        root = step_dir.resolve() if step_dir is not None else None
        step = int(root.name) if root is not None and is_step_dir_name(root.name) else None
        if step is None and record is not None:
            step = record.step
        return cls(str(root) if root is not None else None, step, describe_topology(record))


def describe_topology(record: TrainingStep | None) -> str | None:
    """``training_step.json``'s topology in one line; a 0.6.x record says what it has instead."""
    if record is None:
        return None
    if record.topology is not None:
        return record.topology.describe() + _topology_origin(record)
    if record.is_legacy:
        return f"unknown: 0.6.x-era record (num_processes={record.legacy_num_processes}, no dp_replicate/dp_shard)"
    return None


def _topology_origin(record: TrainingStep) -> str:
    """Where a LeRobot record's topology comes from (ckpt-train's records say it outright)."""
    from ckpt_tools.format.record import RecordSchema

    if record.schema is RecordSchema.LEROBOT:
        return " (training_step.json parallelism)"
    if "topology" in record.derived:
        keyed = "parameter name" if record.sharded else "position"
        return f" (num_processes {record.legacy_num_processes}; optimizer state keyed by {keyed})"
    return ""
