"""``optimizer_param_groups.json``: the param groups of a non-sharded run's flat optimizer state.

The flat ``optimizer_state.safetensors`` keys its tensors by parameter name
(:func:`ckpt_tools.format.layout.flat_optimizer_key`); this file lists the optimizer's param
groups (their hyperparameters and the parameter names each holds) and the non-tensor slots.
The trainer writes and loads it; ``verify-resume`` checks it. Both read it through
:func:`read_param_groups`, so a damaged file is the same one line for both.
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


def read_param_groups(path: str | os.PathLike[str]) -> ParamGroups:
    """The file at ``path``, or :class:`CheckpointError`: one line naming it (missing, unreadable, malformed)."""
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
