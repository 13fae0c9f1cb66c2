"""One check result: a name, pass / warn / fail, and the line that explains it."""

from __future__ import annotations

from dataclasses import dataclass

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass(frozen=True)
class Check:
    name: str  # stable identifier, e.g. "weights", "rng-state"
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
