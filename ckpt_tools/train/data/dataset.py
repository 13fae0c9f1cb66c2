"""The on-disk robot dataset: ``meta/info.json``, ``meta/stats.json``, ``data/frames.safetensors``.

A sample is the observation at frame t and the action chunk t … t+chunk_size-1 of the same
episode; steps past the episode end repeat its last action and are flagged in
``action_is_pad`` so the loss ignores them. The frames live in memory (memory-mapped), and
batches are gathered by index, so data loading is deterministic and costs nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ckpt_tools.errors import ConfigError
from ckpt_tools.format.dataset import (
    ACTION_COLUMN,
    EPISODE_COLUMN,
    FRAMES_FILE,
    INFO_FILE,
    NORMALIZED_COLUMNS,
    REQUIRED_COLUMNS,
    STATE_COLUMN,
    STATS_FILE,
    rows_problem,
    stats_problem,
)
from ckpt_tools.io.safe_read import read_json


@dataclass
class RobotDataset:
    root: Path
    state: torch.Tensor  # [N, state_dim]
    action: torch.Tensor  # [N, action_dim]
    episode_end: torch.Tensor  # [N] exclusive end frame of each frame's episode
    stats: dict[str, dict[str, list[float]]]
    chunk_size: int

    def __len__(self) -> int:
        return int(self.state.shape[0])

    @property
    def state_dim(self) -> int:
        return int(self.state.shape[1])

    @property
    def action_dim(self) -> int:
        return int(self.action.shape[1])

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        steps = indices[:, None] + torch.arange(self.chunk_size)[None, :]
        end = self.episode_end[indices][:, None]
        is_pad = steps >= end
        steps = torch.minimum(steps, end - 1)
        return {
            "index": indices,
            "observation.state": self.state[indices],
            "action": self.action[steps],
            "action_is_pad": is_pad,
        }


def resolve_root(root: str | None, repo_id: str | None, revision: str | None = None) -> Path:
    """A local ``--dataset.root``, or ``--dataset.repo_id`` through the Hugging Face cache.

    The cache is tried first without network (``local_files_only``), so an offline machine
    with the dataset cached never needs the Hub.
    """
    if root:
        path = Path(root).expanduser()
        if not path.is_dir():
            raise ConfigError(f"--dataset.root={root}: no such directory")
        return path
    if not repo_id:
        raise ConfigError("--dataset.repo_id or --dataset.root is required")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
            raise ConfigError(
                f"--dataset.repo_id={repo_id}: not in the Hugging Face cache and HF_HUB_OFFLINE is set"
            ) from None
    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", revision=revision))
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise ConfigError(f"--dataset.repo_id={repo_id}: could not be fetched ({type(e).__name__})") from None


def _check_rows(root: Path, columns: dict[str, torch.Tensor], info: object) -> None:
    """Row counts the files must agree on (:func:`ckpt_tools.format.dataset.rows_problem`)."""
    problem = rows_problem({name: tuple(t.shape) for name, t in columns.items()}, info)
    if problem is not None:
        raise ConfigError(f"dataset {root}: {problem}")


def load_dataset(root: Path, chunk_size: int) -> RobotDataset:
    frames_file = root / FRAMES_FILE
    try:
        columns = load_file(str(frames_file))
        stats = read_json(root / STATS_FILE)
        info = read_json(root / INFO_FILE)
    except FileNotFoundError as e:  # safetensors' own reader names no file
        where = Path(e.filename).relative_to(root) if e.filename else FRAMES_FILE
        raise ConfigError(f"dataset {root}: missing {where}") from None
    except (SafetensorError, ValueError, OSError) as e:
        raise ConfigError(f"dataset {root}: unreadable ({e})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise ConfigError(f"dataset {root}: {FRAMES_FILE} lacks columns {missing}")
    _check_rows(root, columns, info)
    episode = columns[EPISODE_COLUMN].long()
    if len(episode) == 0:
        raise ConfigError(f"dataset {root}: no frames")
    state, action = columns[STATE_COLUMN].float(), columns[ACTION_COLUMN].float()
    for column, values in zip(NORMALIZED_COLUMNS, (state, action), strict=True):
        if values.dim() != 2 or len(values) != len(episode):
            raise ConfigError(f"dataset {root}: {FRAMES_FILE}: {column} is not one row per frame")
    problem = stats_problem(stats, {STATE_COLUMN: state.shape[1], ACTION_COLUMN: action.shape[1]})
    if problem is not None:
        raise ConfigError(f"dataset {root}: {problem}")
    for column, values in zip(NORMALIZED_COLUMNS, (state, action), strict=True):
        _refuse_nonfinite(root, column, values, episode)
    # Frames are stored episode by episode; each frame's episode ends where its index changes.
    change = torch.nonzero(episode[1:] != episode[:-1]).flatten() + 1
    bounds = torch.cat([change, torch.tensor([len(episode)])])
    lengths = torch.diff(torch.cat([torch.tensor([0]), bounds]))
    episode_end = torch.repeat_interleave(bounds, lengths)
    return RobotDataset(
        root=root,
        state=state,
        action=action,
        episode_end=episode_end,
        stats=stats,
        chunk_size=chunk_size,
    )


def _refuse_nonfinite(root: Path, column: str, values: torch.Tensor, episode: torch.Tensor) -> None:
    """A NaN or infinite frame makes the loss of every batch holding it NaN: refuse it at load.

    The frames are in memory already; one pass over them costs a few milliseconds per million.
    """
    bad_rows = torch.nonzero(~torch.isfinite(values).all(dim=1)).flatten()
    if len(bad_rows):
        first = int(bad_rows[0])
        raise ConfigError(
            f"dataset {root}: {FRAMES_FILE}: {column} is NaN or infinite in {len(bad_rows)} frame(s)"
            f" (first: frame {first}, episode {int(episode[first])}); fix or drop those frames"
        )
