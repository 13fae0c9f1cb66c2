"""The saved param groups and LR-scheduler state a resume takes, read for
:mod:`ckpt_tools.format.rules.saved_hyperparameters` to compare with the run's settings.

The DCP param groups are restricted-loaded (plain objects only, bounded in size): nothing in
the checkpoint runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpt_tools.dcp.files import ShardFiles
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.dcp.reader import read_pickled_object
from ckpt_tools.dcp.validate import OBJECT_LIMIT, PLAIN_OBJECTS
from ckpt_tools.errors import CkptError
from ckpt_tools.facts import ema
from ckpt_tools.facts.scheduler_state import read_scheduler_state
from ckpt_tools.format import layout as L
from ckpt_tools.format import manifest
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.rules import saved_hyperparameters as rule
from ckpt_tools.format.rules.startup import RunSettings
from ckpt_tools.io.safe_read import read_json_file

_GROUP_BYTES = "param_groups"


def mismatch(paths: StepPaths, settings: RunSettings) -> str | None:
    """One line naming what in the saved optimizer / scheduler state the resume would not run with, or None.

    ``settings``: the resumed run's (the saved config under the resume's flags). Files that are
    missing or unreadable are other checks' concern; None then.
    """
    found = problems(paths, settings)
    return rule.summary(paths.root, found) if found else None


def problems(paths: StepPaths, settings: RunSettings) -> list[str]:
    """Every disagreement of the saved state of ``paths`` with ``settings``, the EMA schedule's included."""
    if not rule.comparable(settings):
        return []
    scheduler = read_scheduler_state(paths)
    out = rule.problems(settings, _saved_groups(paths), scheduler)
    ema_change = ema.schedule_change(paths, settings.ema_enable, settings.ema_schedule)
    if ema_change is not None:
        out.append(ema_change)
    return out


def _saved_groups(paths: StepPaths) -> list[dict[str, Any]] | None:
    """The saved param groups without their ``params``, from the container the resume reads (None: not readable here)."""
    chosen = manifest.choose(manifest.optimizer_inputs(), paths)
    if chosen is None:
        return None
    try:
        if chosen is manifest.OPTIMIZER_DCP:
            return _dcp_groups(paths.root / chosen.path)
        data = read_json_file(paths.optimizer_param_groups)
    except (CkptError, OSError, ValueError):
        return None  # the optimizer check reports it
    if isinstance(data, dict):  # this trainer's first form: {"param_groups": [...], ...}
        data = data.get(_GROUP_BYTES)
    if not isinstance(data, list) or not all(isinstance(g, dict) for g in data):
        return None
    return [{k: v for k, v in g.items() if k != "params"} for g in data]


def _dcp_groups(directory: Path) -> list[dict[str, Any]] | None:
    """``optimizer.param_groups.<i>.<key>`` items of the DCP optimizer state, restricted-loaded."""
    index = ChunkIndex.load(directory)
    by_group: dict[int, dict[str, Any]] = {}
    with ShardFiles(index.root) as files:
        for item in index.byte_items.values():
            path = item.path
            if len(path) != 4 or path[0] != L.OPTIMIZER_DCP_KEY or path[1] != _GROUP_BYTES or path[3] == "params":
                continue
            position = path[2]
            if not isinstance(position, int):
                try:
                    position = int(position)
                except ValueError:
                    return None
            fd, start, length = files.span(item, limit=OBJECT_LIMIT)
            value = read_pickled_object(fd, start, length, PLAIN_OBJECTS, what=f"{item.file} ({item.fqn})")
            by_group.setdefault(position, {})[str(path[3])] = value
    if not by_group or sorted(by_group) != list(range(len(by_group))):
        return None
    return [by_group[i] for i in range(len(by_group))]
