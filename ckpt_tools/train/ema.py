"""The EMA shadow of the weights (``--ema.enable=true``): LeRobot main's update, on every layout.

LeRobot keeps diffusers' ``EMAModel`` on the main process only and refuses sharded runs. Here
the shadow is one tensor per parameter shaped as the live one: a full copy on one process or
under DDP (every rank holds it: the replicas are identical), a DTensor sharded exactly like
its parameter under FSDP2/HSDP, so it costs 1/N of the weights per rank. The update runs on
each rank's local piece with diffusers' arithmetic (``s.sub_((1 - decay) * (s - p))``),
elementwise, so it gives the same bits as LeRobot's full-tensor update. The decay comes from
:meth:`ckpt_tools.format.ema.EmaSchedule.decay_at`, the tools' rule.

Saved as LeRobot saves it on the gathered layouts (``training_state/ema_state.pt``, diffusers'
``state_dict()``, plus the parameter names; ``pretrained_model_ema/model.safetensors``) and as
DCP shards (``pretrained_model_ema/pytorch_model_fsdp_0/``) on the sharded ones, which reshard
on load like the model's.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from ckpt_tools.dcp.torch_file import read_contiguous
from ckpt_tools.errors import CheckpointError
from ckpt_tools.facts.ema_state import NAMES_KEY, read_ema_state
from ckpt_tools.format.ema import EmaSchedule


class EmaShadow:
    """The shadow: one tensor per named parameter of the (unwrapped) model, updated after each optimizer update."""

    def __init__(self, model: torch.nn.Module, schedule: EmaSchedule) -> None:
        self.schedule = schedule
        self.params = dict(model.named_parameters())
        # A tied parameter appears under each of its names in a state dict: every name gets the one shadow.
        by_id = {id(p): name for name, p in self.params.items()}
        self.aliases = {n: by_id[id(p)] for n, p in model.named_parameters(remove_duplicate=False)}
        with torch.no_grad():
            self.shadow = {name: p.detach().clone() for name, p in self.params.items()}
        self.optimization_step = 0
        self.cur_decay_value: float | None = None

    @torch.no_grad()
    def step(self) -> None:
        """One EMA update from the live weights (diffusers' ``EMAModel.step``)."""
        self.optimization_step += 1
        decay = self.schedule.decay_at(self.optimization_step)
        self.cur_decay_value = decay
        one_minus_decay = 1 - decay
        for name, param in self.params.items():
            s, p = _local(self.shadow[name]), _local(param)
            if param.requires_grad:
                s.sub_(one_minus_decay * (s - p))
            else:
                s.copy_(p)

    def model_state(self, model_state: dict[str, Any]) -> dict[str, Any]:
        """``model_state`` (the checkpoint's weights, buffers included) with each parameter's shadow in its place."""
        return {k: self.shadow.get(self.aliases.get(k, k), v) for k, v in model_state.items()}

    def lerobot_state(self) -> dict[str, Any]:
        """What LeRobot's ``ema_state.pt`` holds (diffusers' ``EMAModel.state_dict()``), plus the names.

        Full tensors on CPU: called on a non-sharded run only (the shadow is a plain copy there).
        """
        low, high = self.schedule.clamp
        return {
            "decay": high,
            "min_decay": low,
            "optimization_step": self.optimization_step,
            "update_after_step": self.schedule.update_after_step,
            "use_ema_warmup": True,
            "inv_gamma": self.schedule.inv_gamma,
            "power": self.schedule.power,
            "shadow_params": [t.detach().cpu() for t in self.shadow.values()],
            NAMES_KEY: list(self.shadow),
        }

    def load_full(self, full: dict[str, torch.Tensor]) -> None:
        """Full tensors by name into the shadow, whatever its layout (a sharded shadow takes its own shards)."""
        missing = sorted(set(self.shadow) - set(full))
        if missing:
            raise CheckpointError(f"EMA state: no shadow for {len(missing)} parameter(s), first {missing[0]}")
        with torch.no_grad():
            for name, target in self.shadow.items():
                value = full[name]
                if tuple(value.shape) != tuple(target.shape):
                    raise CheckpointError(
                        f"EMA state: {name} is {list(value.shape)}, the model's parameter {list(target.shape)}"
                    )
                value = value.to(device=_local(target).device, dtype=target.dtype)
                if isinstance(target, DTensor):
                    value = distribute_tensor(value, target.device_mesh, target.placements).to_local()
                _local(target).copy_(value)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def save_lerobot_state(state: dict[str, Any], path: Path) -> None:
    """``ema_state.pt`` as LeRobot writes it (``torch.save`` of the state dict)."""
    torch.save(state, path)


def read_lerobot_state(path: Path, expected: EmaShadow) -> tuple[dict[str, torch.Tensor], int]:
    """``ema_state.pt`` back: (shadow by name, optimization_step), through the tools' restricted reader.

    Nothing in the file runs (:func:`ckpt_tools.facts.ema_state.read_ema_state`). LeRobot's own
    file has no names: its tensors are matched by the parameters' order, as diffusers'
    ``load_state_dict`` matches them.
    """
    saved = read_ema_state(path)
    names = saved.names if saved.names is not None else tuple(expected.shadow)
    if len(names) != len(saved.tensors):
        raise CheckpointError(f"{path}: {len(saved.tensors)} shadow tensors for {len(names)} parameters")
    full = {}
    for name, layout in zip(names, saved.tensors, strict=True):
        dtype = getattr(torch, layout.dtype.name)
        raw = bytearray(read_contiguous(path, layout))
        full[name] = (
            torch.frombuffer(raw, dtype=dtype).reshape(layout.size) if raw else torch.empty(layout.size, dtype=dtype)
        )
    return full, saved.optimization_step


def schedule_of(config: Any) -> EmaSchedule:
    """The trainer's ``--ema.*`` group as the shared schedule."""
    fields = asdict(EmaSchedule())
    return EmaSchedule(**{k: getattr(config, k) for k in fields})
