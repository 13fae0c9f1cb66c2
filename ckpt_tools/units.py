"""Sizes and counts written for people: one spelling everywhere a byte size or a count is shown.

``inspect``, ``convert-dcp``, ``reshard-plan``, ``push`` and the generated model card all show
sizes; they read the same when they come from one function. Binary units (KiB, MiB, ...) are
used because they are what ``ls -h``, ``du -h`` and torch's memory reports use. This module
imports nothing of the project, so tool internals and the CLI can both use it.
"""

from __future__ import annotations

from collections.abc import Iterable

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_COUNT_UNITS = ((10**12, "T", 2), (10**9, "B", 2), (10**6, "M", 2), (10**3, "K", 1))


def human_bytes(n: int) -> str:
    """1536 → '1.5 KiB'; exact below 1 KiB so small files stay recognisable."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in _BYTE_UNITS[1:]:
        value /= 1024
        if value < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{n} B"  # pragma: no cover - the loop always returns


def human_count(n: int) -> str:
    """A parameter (or any) count: 2_520_000 → '2.52M'; exact below a thousand."""
    for scale, unit, digits in _COUNT_UNITS:
        if n >= scale:
            return f"{n / scale:.{digits}f}{unit}"
    return str(n)


def rank_ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] → '0-2,5'."""
    return interval_ranges((r, r + 1) for r in sorted(set(ranks)))


def interval_ranges(intervals: Iterable[tuple[int, int]]) -> str:
    """Sorted half-open ranges [(0, 3), (3, 4), (5, 6)] → '0-3,5', without listing their members (a range may
    hold millions of ranks)."""
    merged: list[tuple[int, int]] = []
    for lo, hi in intervals:
        if hi <= lo:
            continue
        if merged and merged[-1][1] == lo:
            merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return ",".join(str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}" for lo, hi in merged)
