"""One command in a fresh process: its CPU seconds, wall seconds and peak resident memory.

The child's resource usage comes from ``os.wait4`` (user + system CPU, ``ru_maxrss``) - its own
and that of the processes it started and waited for (a worker a tool spawns counts) - so
neither this process nor other children blur it; CPU time is the number to trust on a shared
machine, where wall time also counts waiting for a core. A command that outlives its timeout
is killed with everything it started and reported as such, never waited on forever.

Linux counts a child's peak from the memory it was forked from: ``ru_maxrss`` is never below
the parent's resident size at the fork, so the measuring process must stay small (no torch).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from devtools.procs import kill_tree

POLL = 0.02


@dataclass(frozen=True)
class Sample:
    cpu: float  # user + system seconds of the child
    wall: float
    peak_mib: float  # the child's peak resident set
    code: int | None  # exit status (negative: killed by that signal); None: timed out

    @property
    def timed_out(self) -> bool:
        return self.code is None


def run_once(
    cmd: list[str], env: dict[str, str] | None = None, timeout: float | None = None, log: Path | None = None
) -> Sample:
    """Run ``cmd`` to its end (or its timeout); its output goes to ``log`` (or nowhere)."""
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 (closed below)
    try:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=out, start_new_session=True)
        deadline = None if timeout is None else started + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if deadline is not None and time.perf_counter() > deadline:
                kill_tree(proc.pid)
                _, _, usage = os.wait4(proc.pid, 0)
                proc.returncode = -9
                return Sample(
                    usage.ru_utime + usage.ru_stime, time.perf_counter() - started, usage.ru_maxrss / 1024, None
                )
            time.sleep(POLL)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        return Sample(usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024, proc.returncode)
    finally:
        if log is not None:
            out.close()


@dataclass(frozen=True)
class Measured:
    """The median of several runs (a timeout or a failure in any run is what is reported)."""

    samples: tuple[Sample, ...]

    def _median(self, field: str) -> float:
        return statistics.median(getattr(s, field) for s in self.samples)

    @property
    def cpu(self) -> float:
        return self._median("cpu")

    @property
    def wall(self) -> float:
        return self._median("wall")

    @property
    def peak_mib(self) -> float:
        return max(s.peak_mib for s in self.samples)

    @property
    def code(self) -> int | None:
        bad = [s.code for s in self.samples if s.code != 0]
        return bad[0] if bad else 0

    @property
    def timed_out(self) -> bool:
        return any(s.timed_out for s in self.samples)
