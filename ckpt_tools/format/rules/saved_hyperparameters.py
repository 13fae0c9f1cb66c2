"""The optimizer and LR-scheduler settings a resume takes from the checkpoint, against its config.

A resume does not rebuild these from ``train_config.json``: torch's
``Optimizer.load_state_dict`` replaces every param group's ``lr``, ``betas``, ``eps``,
``weight_decay`` (and every option) with the saved group's, and ``LambdaLR.load_state_dict``
copies whatever the saved scheduler state holds into the scheduler object. So a state file
whose values disagree with the config - edited, from another run, or a config changed on the
resume command line (``--optimizer.lr=...``) - silently changes the run, a value of the wrong
type stops it with a traceback some steps later, and a NaN trains to NaN. This module is the
one rule, called by the trainer before any process group and again by its load, and by
``verify-resume`` (torch-free: :mod:`ckpt_tools.facts.saved_hyperparameters` reads the DCP
param groups with the restricted reader).

The expected values are the ones the trainer builds its AdamW with (:func:`adamw_options`,
which the trainer calls), so there is no second copy of them here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpt_tools.format import layout as L
from ckpt_tools.format.record import SAVE_ID_KEY
from ckpt_tools.format.rules.run_settings import RunSettings

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


def comparable(settings: RunSettings) -> bool:
    """Whether ``settings`` give the values to compare (a config without them is refused by the config checks)."""
    return not (settings.lr is None or settings.betas is None or settings.eps is None or settings.weight_decay is None)


def problems(
    settings: RunSettings, groups: Sequence[Mapping[str, Any]] | None, scheduler: Mapping[str, Any] | None
) -> list[str]:
    """What in the saved param ``groups`` (without their ``params``) and ``scheduler`` state differs from ``settings``.

    None for a part not read (missing or unreadable: other checks' concern).
    """
    if not comparable(settings):
        return []
    out: list[str] = []
    if scheduler is not None:
        out += _scheduler_problems(scheduler, settings)
    if groups is not None:
        out += _group_problems(groups, settings, scheduler)
    return out


def summary(root: Path, found: list[str]) -> str:
    """The one line for ``found`` at the step ``root``: the first, and how many more."""
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return f"{root}: {found[0]}{more}"


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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_lr(value: object) -> bool:
    return _is_number(value) and value >= 0  # type: ignore[operator]
