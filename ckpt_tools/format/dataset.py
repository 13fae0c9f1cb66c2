"""The robot dataset directory the trainer loads and the tools check, by name.

    <dataset root>/
    ├── meta/info.json
    ├── meta/stats.json           per-column normalization statistics
    └── data/frames.safetensors   one row per frame: observation.state, action, episode_index

Frames are stored episode by episode. The number of samples is the number of frames, the
first dimension of :data:`LENGTH_COLUMN`; ``verify-resume`` reads it from the safetensors
header to check that a resumed sampler position still points into the same dataset.
"""

from __future__ import annotations

from pathlib import Path

FRAMES_FILE = Path("data") / "frames.safetensors"
INFO_FILE = Path("meta") / "info.json"
STATS_FILE = Path("meta") / "stats.json"
STATE_COLUMN = "observation.state"
ACTION_COLUMN = "action"
EPISODE_COLUMN = "episode_index"
REQUIRED_COLUMNS = (STATE_COLUMN, ACTION_COLUMN, EPISODE_COLUMN)
LENGTH_COLUMN = STATE_COLUMN  # every column has one row per frame; the trainer counts samples in this one
