"""One check result, shared by ``inspect``, ``verify-resume`` and ``reshard-plan``.

A check has a stable ``name``, a ``status`` - ``pass``, ``warn`` or ``fail`` - and a one-line
``message`` written for the person at the terminal. Every command's ``--json`` output shows a
check the same way, ``{"name": ..., "status": ..., "message": ...}`` (:meth:`Check.to_dict`),
so a CI script reads the health of a checkpoint and the verdict on a resume with one parser.

What the statuses mean is each command's: ``inspect`` fails a check when the checkpoint is
broken and warns when it is loadable but worth knowing about; ``verify-resume`` fails a check
exactly when the resume would stop on it.
"""

from __future__ import annotations

from dataclasses import dataclass

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
