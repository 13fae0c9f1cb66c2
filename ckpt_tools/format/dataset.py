"""The robot dataset directory the trainer loads and the tools check, by name.

    <dataset root>/
    ├── meta/info.json
    ├── meta/stats.json           per-column normalization statistics
    └── data/frames.safetensors   one row per frame: observation.state, action, episode_index

Frames are stored episode by episode. The number of samples is the number of frames, the
first dimension of :data:`LENGTH_COLUMN`; ``verify-resume`` reads it from the safetensors
header to check that a resumed sampler position still points into the same dataset.

The statistics normalize :data:`NORMALIZED_COLUMNS` (``(x - mean) / std``); one NaN, an
infinity or a zero ``std`` there turns every batch into NaN, so :func:`stats_problem` refuses
such a file before training starts; :func:`rows_problem` refuses files that disagree on the
number of frames.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

FRAMES_FILE = Path("data") / "frames.safetensors"
INFO_FILE = Path("meta") / "info.json"
STATS_FILE = Path("meta") / "stats.json"
STATE_COLUMN = "observation.state"
ACTION_COLUMN = "action"
EPISODE_COLUMN = "episode_index"
REQUIRED_COLUMNS = (STATE_COLUMN, ACTION_COLUMN, EPISODE_COLUMN)
LENGTH_COLUMN = STATE_COLUMN  # every column has one row per frame; the trainer counts samples in this one
NORMALIZED_COLUMNS = (STATE_COLUMN, ACTION_COLUMN)  # what meta/stats.json must describe


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def stats_problem(stats: object, dims: Mapping[str, int]) -> str | None:
    """Why ``meta/stats.json`` cannot normalize the frames, naming the feature, or None.

    ``dims`` gives each column's width in the frames (a column left out is not compared).
    Every ``mean`` and ``std`` value must be a finite number and every ``std`` positive.
    """
    if not isinstance(stats, dict):
        return f"{STATS_FILE}: not a JSON object"
    for column in NORMALIZED_COLUMNS:
        entry = stats.get(column)
        if not isinstance(entry, dict):
            return f"{STATS_FILE}: no statistics for {column}"
        for key in ("mean", "std"):
            values = entry.get(key)
            feature = f"{column}.{key}"
            if not isinstance(values, list) or not all(_is_number(v) for v in values):
                return f"{STATS_FILE}: {feature} is not a list of numbers"
            width = dims.get(column)
            if width is not None and len(values) != width:
                return f"{STATS_FILE}: {feature} has {len(values)} values, the frames' {column} has {width}"
            bad = [i for i, v in enumerate(values) if not math.isfinite(v) or (key == "std" and v <= 0)]
            if bad:
                first = bad[0]
                more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
                need = "a finite number above 0" if key == "std" else "a finite number"
                return f"{STATS_FILE}: {feature}[{first}]={values[first]}{more}: must be {need}"
    return None


TOTAL_FRAMES = "total_frames"  # info.json's frame count


def rows_problem(columns: Mapping[str, Sequence[int]], info: object) -> str | None:
    """Why the dataset's files disagree on how many frames it holds, naming them, or None.

    ``columns`` are the shapes of every column of ``frames.safetensors`` (each has one row per
    frame: a shorter one would be indexed past its end mid-training), ``info`` the parsed
    ``info.json``, whose ``total_frames``, when given, must be that count. ``episode_index``
    must be ``[frames]``: episode ends are found along it.
    """
    shape = columns.get(LENGTH_COLUMN)
    if not shape:
        return f"{FRAMES_FILE}: {LENGTH_COLUMN} has no rows (shape {list(shape or ())})"
    frames = shape[0]
    for name, other in sorted(columns.items()):
        if not other or other[0] != frames:
            rows = other[0] if other else "no"
            return (
                f"{FRAMES_FILE}: {name} has {rows} rows, {LENGTH_COLUMN} {frames} (every column has one row per frame)"
            )
    episode = columns.get(EPISODE_COLUMN)
    if episode is not None and len(episode) != 1:
        return f"{FRAMES_FILE}: {EPISODE_COLUMN} must be [frames], not {list(episode)}"
    total = info.get(TOTAL_FRAMES) if isinstance(info, dict) else None
    if _is_number(total) and total != frames:
        return f"{INFO_FILE} says {TOTAL_FRAMES} {total}, {FRAMES_FILE} holds {frames} frames"
    return None
