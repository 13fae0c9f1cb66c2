"""The optimizer and LR-scheduler settings a resume takes from the checkpoint, against its config.

A resume does not rebuild these from ``train_config.json``: torch's
``Optimizer.load_state_dict`` replaces every param group's ``lr``, ``betas``, ``eps``,
``weight_decay`` (and every option) with the saved group's, and ``LambdaLR.load_state_dict``
copies whatever the saved scheduler state holds into the scheduler object. So a state file
whose values disagree with the config - edited, from another run, or a config changed on the
resume command line (``--optimizer.lr=...``) - silently changes the run, a value of the wrong
type stops it with a traceback some steps later, and a NaN trains to NaN. This module is the
one rule, called by the trainer before any process group and again by its load, and by
``verify-resume`` (torch-free: the DCP param groups are read with the restricted reader).

The expected values are the ones the trainer builds its AdamW with (:func:`adamw_options`,
which the trainer calls), so there is no second copy of them here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ckpt_tools.errors import CkptError
from ckpt_tools.format import ema, manifest
from ckpt_tools.format import layout as L
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.record import SAVE_ID_KEY
from ckpt_tools.format.rules.run_settings import RunSettings
from ckpt_tools.io.safe_read import read_json_file

# AdamW options the trainer never takes from a flag: passed explicitly, so that a saved group
# with another value (amsgrad without its extra state, foreach/fused numerics) is refused.
FIXED_OPTIONS: dict[str, object] = {
    "amsgrad": False,
    "maximize": False,
    "foreach": None,
    "capturable": False,
    "differentiable": False,
    "fused": None,
}
# Keys torch's AdamW adds to a group on its own (absent in checkpoints of older torch).
_TORCH_ADDED = {"decoupled_weight_decay": True}
# What LambdaLR.state_dict holds (``verbose`` up to torch 2.6, ``_is_initial`` from 2.7).
_SCHEDULER_KEYS = {
    "base_lrs",
    "last_epoch",
    "_step_count",
    "_get_lr_called_within_step",
    "_last_lr",
    "lr_lambdas",
    "verbose",
    "_is_initial",
    SAVE_ID_KEY,  # the save's stamp (ckpt_tools.format.rules.save_stamps), dropped by the load
}
_GROUP_BYTES = "param_groups"


def adamw_options(settings: RunSettings) -> dict[str, Any]:
    """The keyword arguments of the trainer's ``torch.optim.AdamW`` (every option, explicitly)."""
    assert settings.lr is not None and settings.betas is not None
    return {
        "lr": settings.lr,
        "betas": tuple(settings.betas),
        "eps": settings.eps,
        "weight_decay": settings.weight_decay,
        **FIXED_OPTIONS,
    }


def mismatch(paths: StepPaths, settings: RunSettings) -> str | None:
    """One line naming what in the saved optimizer / scheduler state the resume would not run with, or None.

    ``settings``: the resumed run's (the saved config under the resume's flags). Files that are
    missing or unreadable are other checks' concern; None then.
    """
    found = problems(paths, settings)
    if not found:
        return None
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return f"{paths.root}: {found[0]}{more}"


def problems(paths: StepPaths, settings: RunSettings) -> list[str]:
    if settings.lr is None or settings.betas is None or settings.eps is None or settings.weight_decay is None:
        return []  # a config without these is refused by the config checks
    groups = _saved_groups(paths)
    scheduler = _saved_scheduler(paths)
    out: list[str] = []
    if scheduler is not None:
        out += _scheduler_problems(scheduler, settings)
    if groups is not None:
        out += _group_problems(groups, settings, scheduler)
    ema_change = ema.schedule_change(paths, settings.ema_enable, settings.ema_schedule)
    if ema_change is not None:
        out.append(ema_change)
    return out


def _scheduler_problems(state: Mapping[str, Any], settings: RunSettings) -> list[str]:
    where = f"{L.TRAINING_STATE_DIR}/{L.SCHEDULER_STATE}"
    out = [
        f"{where}: unknown key '{key}' (LambdaLR would set it on the scheduler)"
        for key in state
        if key not in _SCHEDULER_KEYS
    ]
    for key in ("base_lrs", "last_epoch", "_step_count", "_last_lr", "lr_lambdas"):
        if key not in state:
            out.append(f"{where}: no '{key}'")
    if out:
        return out
    for key in ("last_epoch", "_step_count"):
        value = state[key]
        if not _is_int(value) or value < 0:
            out.append(f"{where}: {key} {value!r} is not a count")
    for key in ("_get_lr_called_within_step", "_is_initial"):
        if key in state and not isinstance(state[key], bool):
            out.append(f"{where}: {key} {state[key]!r} is not true/false")
    lambdas = state["lr_lambdas"]
    if not isinstance(lambdas, list) or any(fn is not None for fn in lambdas):
        out.append(f"{where}: lr_lambdas {lambdas!r}: the trainer's schedule is a function, saved as null")
    for key in ("base_lrs", "_last_lr"):
        values = state[key]
        if not isinstance(values, list) or not values or not all(_is_lr(v) for v in values):
            out.append(f"{where}: {key} {values!r} is not a list of finite learning rates >= 0")
    if not out:
        changed = [v for v in state["base_lrs"] if v != settings.lr]
        if changed:
            out.append(
                f"{where}: base_lrs {changed[0]!r}, the config's --optimizer.lr is {settings.lr!r}:"
                " a resume continues the saved schedule (to change it, start a new run from its weights: --policy.path=<step>/pretrained_model)"
            )
    return out


def _group_problems(
    groups: Sequence[Mapping[str, Any]], settings: RunSettings, scheduler: Mapping[str, Any] | None
) -> list[str]:
    where = "the saved optimizer param groups"
    if len(groups) != 1:
        return [f"{where}: {len(groups)} groups, the trainer's AdamW has 1"]
    group = groups[0]
    expected = {**adamw_options(settings), "initial_lr": settings.lr}
    expected.pop("lr")  # the scheduled lr: compared with the scheduler's below
    out = []
    for key, want in expected.items():
        if key not in group:
            out.append(f"{where}: no '{key}'")
            continue
        have = group[key]
        if isinstance(want, tuple):
            same = (
                isinstance(have, (list, tuple))
                and len(have) == len(want)
                and all(_is_number(h) and h == w for h, w in zip(have, want, strict=True))
            )
        elif isinstance(want, bool) or want is None:
            same = have is want
        else:
            same = _is_number(have) and have == want
        if not same:
            out.append(f"{where}: {key} {have!r}, the config gives {want!r}{_flag_hint(key)}")
    for key, want in _TORCH_ADDED.items():
        if key in group and group[key] is not want:
            out.append(f"{where}: {key} {group[key]!r}, AdamW's is {want!r}")
    lr = group.get("lr")
    if not _is_lr(lr):
        out.append(f"{where}: lr {lr!r} is not a finite learning rate >= 0")
    elif scheduler is not None and isinstance(scheduler.get("_last_lr"), list) and scheduler["_last_lr"][:1] != [lr]:
        out.append(f"{where}: lr {lr!r}, the saved scheduler's last lr is {scheduler['_last_lr'][:1]!r}: not one save")
    return out


def _flag_hint(key: str) -> str:
    flag = {"initial_lr": "lr", "betas": "betas", "eps": "eps", "weight_decay": "weight_decay"}.get(key)
    if flag is None:
        return " (the trainer sets it)"
    return f" (--optimizer.{flag}; a resume continues the saved optimizer, a new run from its weights takes the flag)"


def _saved_scheduler(paths: StepPaths) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = read_json_file(paths.scheduler_state, want_object=True)
    except (CkptError, OSError, ValueError):
        return None  # missing or unreadable: the scheduler check says so
    return state


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


def _dcp_groups(directory: Any) -> list[dict[str, Any]] | None:
    """``optimizer.param_groups.<i>.<key>`` items of the DCP optimizer state, restricted-loaded."""
    from ckpt_tools.dcp.files import ShardFiles
    from ckpt_tools.dcp.index import ChunkIndex
    from ckpt_tools.dcp.reader import read_pickled_object
    from ckpt_tools.dcp.validate import OBJECT_LIMIT, PLAIN_OBJECTS

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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_lr(value: object) -> bool:
    return _is_number(value) and value >= 0  # type: ignore[operator]
