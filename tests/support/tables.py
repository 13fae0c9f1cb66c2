"""Compare chunk tables field by field: what the index, the cache and a fresh parse must agree on."""

from __future__ import annotations

import numpy as np

from ckpt_tools.dcp.table import ChunkTable

COLUMNS = ("first", "ndim", "offsets", "sizes", "file", "start", "length", "transform")
LISTS = ("names", "dtypes", "shapes", "paths", "files", "transforms", "byte_items")
SCALARS = ("checkpoint_id", "version", "modules", "rank_local")


def table_differences(a: ChunkTable, b: ChunkTable) -> list[str]:
    """Names of the fields in which ``a`` and ``b`` differ (empty: the same table)."""
    out = [c for c in COLUMNS if not np.array_equal(getattr(a, c), getattr(b, c))]
    out += [name for name in (*LISTS, *SCALARS) if getattr(a, name) != getattr(b, name)]
    return out


def same_tables(a: ChunkTable, b: ChunkTable) -> bool:
    return not table_differences(a, b)
