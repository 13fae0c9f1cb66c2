"""``optimizer_param_groups.json``: the param groups of a non-sharded run's flat optimizer state.

The flat ``optimizer_state.safetensors`` keys its tensors by parameter name
(:func:`ckpt_tools.format.layout.flat_optimizer_key`); this file lists the optimizer's param
groups (their hyperparameters and the parameter names each holds) and the non-tensor slots.
The trainer writes and loads it; ``verify-resume`` checks it. Both read it through
:func:`read_param_groups`, so a damaged file is the same one line for both.

LeRobot writes the same file name in its own form (``optim/optimizers.py``
``_save_single_optimizer_state``, 0.6.1 and main): the bare list of torch's param groups, whose
``"params"`` are positions in the optimizer (names for a LeRobot 0.6.x FSDP run), and no
scalars; ``lerobot_form=True`` reads it, with the positions as strings (``"0"``), the way
:func:`ckpt_tools.format.layout.split_flat_optimizer_key` splits LeRobot's keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ckpt_tools.errors import CheckpointError
from ckpt_tools.io.safe_read import read_json_file

GROUPS_KEY = "param_groups"
SCALARS_KEY = "scalars"


@dataclass(frozen=True)
class ParamGroups:
    groups: list[dict[str, Any]]  # torch's param_groups, "params" holding parameter names
    scalars: dict[str, Any]  # flat key -> a slot that is not a tensor

    @property
    def names(self) -> list[str]:
        """Every parameter the groups list, in order: the names a flat key can split into."""
        return [name for group in self.groups for name in group["params"]]


def param_groups_document(groups: list[dict[str, Any]], scalars: dict[str, Any]) -> dict[str, Any]:
    """The JSON document :func:`read_param_groups` reads back."""
    return {GROUPS_KEY: groups, SCALARS_KEY: scalars}


def read_param_groups(path: str | os.PathLike[str], *, lerobot_form: bool = False) -> ParamGroups:
    """The file at ``path``, or :class:`CheckpointError`: one line naming it (missing, unreadable, malformed).

    ``lerobot_form``: the file is LeRobot's (a bare list of groups, parameters by position).
    """
    if lerobot_form:
        return _read_lerobot(path)
    data = read_json_file(path, want_object=True)
    groups, scalars = data.get(GROUPS_KEY), data.get(SCALARS_KEY, {})
    if not isinstance(groups, list) or not all(_is_group(g) for g in groups):
        raise CheckpointError(
            f"{path}: not a param-groups file (expected {GROUPS_KEY!r}: a list of groups, each with 'params' names)"
        )
    if not isinstance(scalars, dict):
        raise CheckpointError(f"{path}: not a param-groups file ({SCALARS_KEY!r} is not an object)")
    return ParamGroups(groups, scalars)


def _is_group(group: object) -> bool:
    params = group.get("params") if isinstance(group, dict) else None
    return isinstance(params, list) and all(isinstance(name, str) for name in params)


def _read_lerobot(path: str | os.PathLike[str]) -> ParamGroups:
    data = read_json_file(path)
    if not isinstance(data, list) or not all(_is_lerobot_group(g) for g in data):
        raise CheckpointError(
            f"{path}: not LeRobot's param-groups file (expected a list of groups, each with 'params' positions or names)"
        )
    groups = [{**g, "params": [str(p) for p in g["params"]]} for g in data]
    return ParamGroups(groups, {})


def _is_lerobot_group(group: object) -> bool:
    params = group.get("params") if isinstance(group, dict) else None
    return isinstance(params, list) and all(
        isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool) and p >= 0) for p in params
    )
