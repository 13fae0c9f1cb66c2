"""``training_state/ema_state.pt`` read torch-free: the one reader of the trainer and the tools.

LeRobot main writes it with ``torch.save(ema.state_dict())`` (diffusers' ``EMAModel``): a dict
of the schedule's numbers, ``optimization_step`` and ``shadow_params``, a list of tensors in
the order of the policy's ``parameters()``. ckpt-train writes the same dict plus
``shadow_param_names`` (:data:`NAMES_KEY`), the parameter name of each tensor. The file is read
through the restricted unpickler (:mod:`ckpt_tools.dcp.torch_file`): nothing in it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ckpt_tools.dcp.reader import ChunkLayout
from ckpt_tools.dcp.torch_file import read_torch_file
from ckpt_tools.errors import CorruptCheckpoint

NAMES_KEY = "shadow_param_names"  # ckpt-train's addition: lets a load match tensors by name, not by position


@dataclass(frozen=True)
class EmaStateFile:
    """What an ``ema_state.pt`` holds: the update count, the shadow tensors (where they are), their names if saved."""

    path: Path
    optimization_step: int
    tensors: tuple[ChunkLayout, ...]
    names: tuple[str, ...] | None  # None: LeRobot's file (matched by the parameters' order)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def read_ema_state(path: Path) -> EmaStateFile:
    """``path`` parsed and checked; one-line :class:`~ckpt_tools.errors.CkptError` for anything else."""
    state = read_torch_file(path)
    shadow = state.get("shadow_params") if isinstance(state, dict) else None
    step = state.get("optimization_step") if isinstance(state, dict) else None
    if not isinstance(shadow, list) or not isinstance(step, int) or isinstance(step, bool):
        raise CorruptCheckpoint(f"{path}: not an EMA state (no shadow_params list / optimization_step)")
    if not all(isinstance(t, ChunkLayout) for t in shadow):
        raise CorruptCheckpoint(f"{path}: shadow_params holds something other than tensors")
    names = state.get(NAMES_KEY)
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise CorruptCheckpoint(f"{path}: {NAMES_KEY} is not a list of names")
        if len(names) != len(shadow) or len(set(names)) != len(names):
            raise CorruptCheckpoint(f"{path}: {len(shadow)} shadow tensors for {len(names)} names")
    return EmaStateFile(path, step, tuple(shadow), tuple(names) if names is not None else None)


SETTINGS_KEYS = ("decay", "min_decay", "update_after_step", "inv_gamma", "power")  # diffusers' names


def read_ema_state_settings(path: Path) -> dict[str, object]:
    """The schedule's numbers saved beside the shadow (diffusers' keys; ``decay`` is the clamp's top)."""
    state = read_torch_file(path)
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{path}: not an EMA state")
    return {k: state[k] for k in SETTINGS_KEYS if k in state}
