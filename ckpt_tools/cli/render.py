"""Human output helpers for the planning commands: byte sizes people read, and aligned tables."""

from __future__ import annotations

from collections.abc import Sequence

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: int) -> str:
    """1536 → '1.5 KiB'; exact below 1 KiB so small files stay recognisable."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in _UNITS[1:]:
        value /= 1024
        if value < 1024 or unit == _UNITS[-1]:
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{n} B"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = (), indent: int = 2) -> str:
    """Columns padded to their widest cell; columns listed in ``right`` are right-aligned (numbers)."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)]
        return (" " * indent + "  ".join(parts)).rstrip()

    rule = " " * indent + "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def rank_ranges(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] → '0-2,5'."""
    out: list[str] = []
    ordered = sorted(ranks)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)
