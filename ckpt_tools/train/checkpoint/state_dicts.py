"""Model and optimizer state in the three shapes a checkpoint uses.

- sharded (DTensor) state dicts for DCP, which reshards on load onto any topology;
- full (gathered, fp32) state dicts, only to load a ``model.safetensors`` (saving writes it from the shards);
- flat files for non-sharded runs (``optimizer_state.safetensors`` +
  ``optimizer_param_groups.json``) in LeRobot's form, keyed by position, with the names by
  position in the safetensors metadata so they also load into a sharded run.

A PEFT run keeps only its trainable parameters (the adapter and any fully trained
modules): the frozen base is never written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ckpt_tools.errors import CheckpointError
from ckpt_tools.format.param_groups import (
    flat_optimizer_files,
    metadata_scalars,
    position_names,
    read_param_groups,
    split_flat_key,
)
from ckpt_tools.io.fsutil import write_json_atomic
from ckpt_tools.train.parallel.wrap import ParallelModel
from ckpt_tools.train.safetensors_io import save_state_dict


def trainable_names(parallel: ParallelModel) -> set[str]:
    return {name for name, p in parallel.inner.named_parameters() if p.requires_grad}


def _keep(state: dict[str, Any], keep: set[str] | None) -> dict[str, Any]:
    return state if keep is None else {k: v for k, v in state.items() if k in keep}


def sharded_model_state(parallel: ParallelModel, only: set[str] | None) -> dict[str, Any]:
    return _keep(get_model_state_dict(parallel.inner), only)


def load_full_model_state(parallel: ParallelModel, state: dict[str, torch.Tensor], partial: bool) -> None:
    options = StateDictOptions(full_state_dict=True, strict=not partial)
    set_model_state_dict(parallel.inner, cast(Any, state), options=options)


def load_sharded_model_state(parallel: ParallelModel, state: dict[str, Any], partial: bool) -> None:
    set_model_state_dict(parallel.inner, state, options=StateDictOptions(strict=not partial))


def sharded_optimizer_state(parallel: ParallelModel, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return get_optimizer_state_dict(parallel.inner, optimizer)


def optimizer_state_to_load(parallel: ParallelModel, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The sharded optimizer state dict a DCP load fills in place: every slot allocated, no values computed.

    Before its first update an optimizer has no state, and ``get_optimizer_state_dict`` makes
    one by running a whole optimizer step on zero gradients (lr 0): for AdamW a pass over every
    parameter, measured as a large share of a resume's load. Allocating the slots as AdamW's own
    lazy init does gives the same state dict (same keys, shapes, dtypes, devices and shards);
    the load then overwrites every value, the counters included.
    """
    allocate_adam_slots(optimizer)
    return get_optimizer_state_dict(parallel.inner, optimizer)


def allocate_adam_slots(optimizer: torch.optim.Optimizer) -> bool:
    """Create the state Adam/AdamW's lazy init would, zero-filled; False (nothing done) for another optimizer.

    As ``Adam._init_group`` does on its first step for a parameter that has a gradient: a CPU
    ``step`` counter in the default scalar dtype, ``exp_avg`` and ``exp_avg_sq`` (and
    ``max_exp_avg_sq`` with amsgrad) shaped like the parameter. Fused and capturable variants
    keep their counter elsewhere and are left to torch.
    """
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW) or optimizer.state:
        return False
    groups = optimizer.param_groups
    if any(g.get("fused") or g.get("capturable") or g.get("differentiable") for g in groups):
        return False
    step_dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    for group in groups:
        for p in group["params"]:
            if not p.requires_grad:
                continue
            slots = {
                "step": torch.tensor(0.0, dtype=step_dtype),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
            if group["amsgrad"]:
                slots["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            optimizer.state[p] = slots
    return True


def load_sharded_optimizer_state(
    parallel: ParallelModel, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    set_optimizer_state_dict(parallel.inner, optimizer, state)


def adam_step(optimizer: torch.optim.Optimizer) -> int | None:
    """The largest ``step`` count in the optimizer's state (None before its first update).

    The record saves it next to the optimizer state, so that a resume can tell that state
    apart from another step's (:mod:`ckpt_tools.format.rules.consistency`). Adam keeps these
    0-d counters on the CPU unless it is capturable or fused: reading them costs no device sync.
    """
    steps = [float(slots["step"]) for slots in optimizer.state.values() if "step" in slots]
    return int(max(steps)) if steps else None


def write_flat_optimizer(
    osd: dict[str, Any], tensors_path: Path, groups_path: Path, stamp: dict[str, str] | None = None
) -> None:
    """Non-sharded runs: LeRobot's two files (:mod:`ckpt_tools.format.param_groups`), names in the metadata.

    ``osd`` is ``get_optimizer_state_dict`` output, keyed by parameter name; the names by
    position travel in the safetensors metadata, so the state also loads into a sharded run.
    """
    groups, tensors, metadata = flat_optimizer_files(osd["param_groups"], osd["state"])
    save_state_dict(tensors, tensors_path, metadata={**metadata, **(stamp or {})})
    write_json_atomic(groups_path, groups)


def load_flat_optimizer(
    parallel: ParallelModel, optimizer: torch.optim.Optimizer, tensors_path: Path, groups_path: Path
) -> None:
    try:
        with safe_open(str(tensors_path), "pt") as f:
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
    except FileNotFoundError as e:
        raise CheckpointError(f"{e.filename or tensors_path}: missing") from None
    except Exception as e:  # damaged safetensors
        raise CheckpointError(f"{tensors_path.parent}: unreadable optimizer state ({e})") from None
    names = position_names(metadata, tensors_path)
    # CheckpointError: one line naming the file
    groups = read_param_groups(groups_path, names=names, scalars=metadata_scalars(metadata, tensors_path))
    param_names = groups.names
    state: dict[str, dict[str, Any]] = {n: {} for n in param_names}
    for flat, value in list(tensors.items()) + list(groups.scalars.items()):
        name, key = _split_flat(flat, param_names, names)
        state[name][key] = value
    osd = {"state": {k: v for k, v in state.items() if v}, "param_groups": groups.groups}
    set_optimizer_state_dict(parallel.inner, optimizer, cast(Any, osd), options=StateDictOptions(full_state_dict=True))


def _split_flat(flat: str, param_names: list[str], by_position: list[str] | None) -> tuple[str, str]:
    """(parameter, slot) of a flat key, refusing state of a parameter the param groups do not list."""
    name, key = split_flat_key(flat, by_position)
    if name not in param_names:
        raise CheckpointError(f"optimizer state names an unknown parameter: {name}")
    return name, key
