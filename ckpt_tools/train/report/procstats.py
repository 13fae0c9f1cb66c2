"""Process facts read from /proc (Linux): peak memory during an interval, process age.

Used to report what a checkpoint save costs (loop pause, extra peak memory per rank) and how
long a resume takes from process start to the first step. Where /proc is not available the
probes return None and nothing else changes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

STATUS = Path("/proc/self/status")


def _status_kib(field: str) -> int | None:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


class PeakMemory:
    """Peak resident memory above the starting point, between :meth:`start` and :meth:`extra_bytes`.

    Writing ``5`` to ``/proc/self/clear_refs`` resets the kernel's peak-RSS mark (VmHWM) to
    the current RSS, so the mark read later is the peak of this interval alone.
    """

    def __init__(self) -> None:
        self.baseline: int | None = None

    def start(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.baseline = None
            return
        self.baseline = _status_kib("VmRSS")

    def extra_bytes(self) -> int | None:
        peak = _status_kib("VmHWM")
        if self.baseline is None or peak is None:
            return None
        return max(0, peak - self.baseline) * 1024


def seconds_since_process_start() -> float | None:
    """Wall time since this process was created (interpreter start-up and imports included)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat: starttime, in clock ticks since boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def now() -> float:
    return time.perf_counter()
