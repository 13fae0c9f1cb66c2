"""A dataset whose files disagree on row or feature counts is refused at start-up, in one line.

The trainer indexes every column with one frame index and finds episode ends along
``episode_index``; a column shorter than the others, an ``info.json`` counting other frames,
a 1-D state or statistics for another number of features used to fail mid-training with a
traceback (or pass silently).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckpt_tools.errors import ConfigError
from ckpt_tools.format.dataset import FRAMES_FILE, INFO_FILE, STATS_FILE
from ckpt_tools.train.data.dataset import load_dataset
from ckpt_tools.train.data.processors import make_processors
from devtools.training import FIXTURE_DATASET


def _frames(edit: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        columns = load_file(str(root / FRAMES_FILE))
        edit(columns)
        save_file(columns, str(root / FRAMES_FILE))

    return apply


def _json(rel: Path, edit: Callable[[dict], object]) -> Callable[[Path], None]:
    """``edit`` changes the document in place."""

    def apply(root: Path) -> None:
        doc = json.loads((root / rel).read_text())
        edit(doc)
        (root / rel).write_text(json.dumps(doc))

    return apply


DAMAGE = {
    "action rows disagree": (
        _frames(lambda c: c.update(action=c["action"][:-10].contiguous())),
        "data/frames.safetensors: action has 2990 rows, observation.state 3000",
    ),
    "episode rows disagree": (
        _frames(lambda c: c.update(episode_index=c["episode_index"][:100].contiguous())),
        "data/frames.safetensors: episode_index has 100 rows, observation.state 3000",
    ),
    "frame_index rows disagree": (
        _frames(lambda c: c.update(frame_index=c["frame_index"][1:].contiguous())),
        "data/frames.safetensors: frame_index has 2999 rows, observation.state 3000",
    ),
    "info.json frame count": (
        _json(INFO_FILE, lambda d: d.update(total_frames=2999)),
        "meta/info.json says total_frames 2999, data/frames.safetensors holds 3000 frames",
    ),
    "2-D episode index": (
        _frames(lambda c: c.update(episode_index=c["episode_index"][:, None].contiguous())),
        "data/frames.safetensors: episode_index must be [frames], not [3000, 1]",
    ),
    "1-D state": (
        _frames(lambda c: c.update({"observation.state": c["observation.state"][:, 0].contiguous()})),
        "observation.state is not one row per frame",
    ),
    "no frames file": (lambda root: (root / FRAMES_FILE).unlink(), "missing data/frames.safetensors"),
    "no stats file": (lambda root: (root / STATS_FILE).unlink(), "missing meta/stats.json"),
    "state stats for 13 features": (
        _json(STATS_FILE, lambda d: d["observation.state"]["mean"].pop()),
        "observation.state.mean has 13 values, the frames' observation.state has 14",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_disagreeing_dataset_files_are_refused_in_one_line(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "tiny_robot"
    shutil.copytree(FIXTURE_DATASET, root)
    apply, needle = DAMAGE[damage]
    apply(root)
    with pytest.raises(ConfigError) as refused:
        load_dataset(root, chunk_size=10)
    message = str(refused.value)
    assert message.startswith(f"dataset {root}: ") and needle in message and "\n" not in message, message


def test_the_fixture_dataset_is_accepted_whole() -> None:
    dataset = load_dataset(FIXTURE_DATASET, chunk_size=10)
    pre, _ = make_processors(dataset.stats)
    batch = pre(dataset.batch(torch.tensor([0, len(dataset) - 1])))
    assert batch["observation.state"].shape == (2, dataset.state_dim) and batch["action"].shape == (2, 10, 7)
