"""Human output helpers for the planning commands: aligned tables and rank ranges.

Byte sizes, counts and rank ranges are spelled by :mod:`ckpt_tools.units` (shared with the tools' messages).
"""

from __future__ import annotations

from collections.abc import Sequence

from ckpt_tools.cli.untrusted import printable
from ckpt_tools.units import rank_ranges

__all__ = ["rank_ranges", "table"]


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = (), indent: int = 2) -> str:
    """Columns padded to their widest cell; columns listed in ``right`` are right-aligned (numbers).

    Cells are escaped (:func:`~ckpt_tools.cli.untrusted.printable`) before they are measured: a
    file name holding an escape sequence takes the width it will be shown at. The result has
    one line per row; echo them one by one (a newline inside :func:`echo`'s line is escaped).
    """
    rows = [[printable(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)]
        return (" " * indent + "  ".join(parts)).rstrip()

    rule = " " * indent + "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])
