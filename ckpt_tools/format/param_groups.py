"""The flat optimizer state of a non-sharded run: ``optimizer_state.safetensors`` + ``optimizer_param_groups.json``.

ckpt-train writes both files in LeRobot's form (``optim/optimizers.py``
``_save_single_optimizer_state``, 0.6.1 and main), so LeRobot's ``load_optimizer_state`` reads
them: the tensors keyed ``state/<position>/<slot>`` (torch's ``optimizer.state_dict()`` flattened
with ``/``), the param groups the bare list of torch's groups with ``"params"`` those positions and
no other key. What ckpt-train needs beyond that goes where LeRobot's readers never look, the
safetensors ``__metadata__`` of ``optimizer_state.safetensors``:

- :data:`PARAM_NAMES_KEY`: the parameter names by position (a JSON list); ckpt-train loads by
  name, so the state also loads into a sharded run or a PEFT subset;
- :data:`SCALARS_KEY`: slots that are not tensors, keyed like the tensors (a JSON object).
  torch's AdamW has none (its ``step`` is a tensor); LeRobot cannot save such slots at all.

Checkpoints ckpt-train wrote before (an object ``{"param_groups": [...names...], "scalars": {...}}``
and keys ``state.<name>.<slot>``) are still read, here and nowhere else. A file LeRobot wrote has
no names: ``lerobot_form=True`` reads it with the positions as strings (``"0"``), the way
:func:`ckpt_tools.format.layout.split_flat_optimizer_key` splits its keys. The trainer and
``verify-resume`` read both files through :func:`read_param_groups` and :func:`split_flat_key`,
so a damaged file is the same one line for both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_tools.errors import CheckpointError
from ckpt_tools.format import layout as L
from ckpt_tools.io.safe_read import read_json_file

PARAM_NAMES_KEY = "ckpt_tools.param_names"  # optimizer_state.safetensors metadata: names by position
SCALARS_KEY = "ckpt_tools.scalar_slots"  # optimizer_state.safetensors metadata: non-tensor slots
# ckpt-train's earlier form (read only): optimizer_param_groups.json an object of these two keys.
OLD_GROUPS_KEY = "param_groups"
OLD_SCALARS_KEY = "scalars"


@dataclass(frozen=True)
class ParamGroups:
    groups: list[dict[str, Any]]  # torch's param_groups, "params" holding parameter names
    scalars: dict[str, Any]  # flat key -> a slot that is not a tensor

    @property
    def names(self) -> list[str]:
        """Every parameter the groups list, in order: the names a flat key can split into."""
        return [name for group in self.groups for name in group["params"]]


def flat_optimizer_files(
    groups: list[dict[str, Any]], state: Mapping[str, Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, str]]:
    """LeRobot's form of a name-keyed optimizer state dict (``get_optimizer_state_dict`` output).

    Returns (param groups JSON, tensors by ``state/<position>/<slot>``, safetensors metadata:
    the names by position and any non-tensor slots). Positions number the parameters across the groups in order,
    as torch's ``optimizer.state_dict()`` does; each group keeps exactly torch's keys.
    """
    names = [name for group in groups for name in group["params"]]
    position = {name: i for i, name in enumerate(names)}
    lerobot_groups = [{**group, "params": [position[n] for n in group["params"]]} for group in groups]
    tensors: dict[str, Any] = {}
    scalars: dict[str, Any] = {}
    for name, slots in state.items():
        for slot, value in slots.items():
            key = L.LEROBOT_OPTIMIZER_SEP.join(("state", str(position[name]), slot))
            (scalars if _is_scalar(value) else tensors)[key] = value
    metadata = {PARAM_NAMES_KEY: json.dumps(names)}
    if scalars:
        metadata[SCALARS_KEY] = json.dumps(scalars)
    return lerobot_groups, tensors, metadata


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def position_names(metadata: Mapping[str, str], where: str | os.PathLike[str]) -> list[str] | None:
    """The parameter names by position ckpt-train keeps in ``optimizer_state.safetensors`` (None: not there)."""
    text = metadata.get(PARAM_NAMES_KEY)
    if text is None:
        return None
    try:
        names = json.loads(text)
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise CheckpointError(f"{where}: metadata {PARAM_NAMES_KEY!r} is not a list of distinct parameter names")
    return names


def metadata_scalars(metadata: Mapping[str, str], where: str | os.PathLike[str]) -> dict[str, Any]:
    """Non-tensor optimizer slots kept in ``optimizer_state.safetensors`` metadata, by flat key."""
    text = metadata.get(SCALARS_KEY)
    if text is None:
        return {}
    try:
        scalars = json.loads(text)
    except ValueError:
        scalars = None
    if not isinstance(scalars, dict):
        raise CheckpointError(f"{where}: metadata {SCALARS_KEY!r} is not a JSON object")
    return scalars


def split_flat_key(key: str, names: list[str] | None) -> tuple[str, str]:
    """(parameter, slot) of an ``optimizer_state.safetensors`` key, in either form.

    ``state/<position>/<slot>`` maps to the name at that position when ``names`` (from
    :func:`position_names`) are given; a position past them stays a number, which no param group
    lists, so the loader (and ``verify-resume``) refuse it as an unknown parameter.
    """
    owner, slot = L.split_flat_optimizer_key(key)
    if names is not None and L.is_lerobot_optimizer_key(key) and owner.isdigit() and int(owner) < len(names):
        return names[int(owner)], slot
    return owner, slot


def read_param_groups(
    path: str | os.PathLike[str],
    *,
    names: list[str] | None = None,
    scalars: Mapping[str, Any] | None = None,
    lerobot_form: bool = False,
) -> ParamGroups:
    """The file at ``path``, or :class:`CheckpointError`: one line naming it (missing, unreadable, malformed).

    A bare list (LeRobot's form, which ckpt-train writes) lists positions: ``names`` (from
    :func:`position_names`) turns them into parameter names; without them only ``lerobot_form``
    reads it (positions as strings, a file LeRobot wrote). ``scalars``: the non-tensor slots kept
    in the tensors file's metadata. ckpt-train's earlier object form holds names and scalars itself.
    """
    data = read_json_file(path)
    if isinstance(data, dict):
        return _read_old(path, data)
    if not isinstance(data, list) or not all(_is_lerobot_group(g) for g in data):
        raise CheckpointError(
            f"{path}: not a param-groups file (expected a list of groups, each with 'params' positions or names)"
        )
    if names is None:
        if not lerobot_form:
            raise CheckpointError(
                f"{path}: parameters by position, but optimizer_state.safetensors names none"
                f" (no {PARAM_NAMES_KEY!r} metadata: a LeRobot checkpoint, not ckpt-train's)"
            )
        return ParamGroups([{**g, "params": [str(p) for p in g["params"]]} for g in data], dict(scalars or {}))
    listed = [p for g in data for p in g["params"]]
    if listed != list(range(len(names))):
        raise CheckpointError(
            f"{path}: the groups list positions {_span(listed)}, the optimizer state names {len(names)} parameters"
        )
    groups, start = [], 0
    for g in data:
        count = len(g["params"])
        groups.append({**g, "params": names[start : start + count]})
        start += count
    return ParamGroups(groups, dict(scalars or {}))


def _span(listed: list[Any]) -> str:
    return f"0..{len(listed) - 1} in order" if listed == list(range(len(listed))) else "out of order or by name"


def _read_old(path: str | os.PathLike[str], data: dict[str, Any]) -> ParamGroups:
    """ckpt-train's earlier form: ``{"param_groups": [...], "scalars": {...}}``, parameters by name."""
    groups, scalars = data.get(OLD_GROUPS_KEY), data.get(OLD_SCALARS_KEY, {})
    if not isinstance(groups, list) or not all(_is_group(g) for g in groups):
        raise CheckpointError(
            f"{path}: not a param-groups file (expected {OLD_GROUPS_KEY!r}: a list of groups, each with 'params' names)"
        )
    if not isinstance(scalars, dict):
        raise CheckpointError(f"{path}: not a param-groups file ({OLD_SCALARS_KEY!r} is not an object)")
    return ParamGroups(groups, scalars)


def _is_group(group: object) -> bool:
    params = group.get("params") if isinstance(group, dict) else None
    return isinstance(params, list) and all(isinstance(name, str) for name in params)


def _is_lerobot_group(group: object) -> bool:
    params = group.get("params") if isinstance(group, dict) else None
    return isinstance(params, list) and all(
        isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool) and p >= 0) for p in params
    )
