"""The flattened state dicts a checkpoint's two DCP directories hold, item by item.

The trainer saves ``{"model": model_state_dict}`` and ``{"optimizer": optimizer_state_dict}``
(``get_optimizer_state_dict``: per parameter ``step``, ``exp_avg``, ``exp_avg_sq``, then the
param groups' entries). DCP flattens each into items keyed ``model.<name>``,
``optimizer.state.<name>.<slot>``, ``optimizer.param_groups.0.<key>``, remembering each key's
path in ``planner_data``. Weights and Adam moments are FSDP2 DTensors sharded on dim 0; the
0-d ``step`` counters are plain tensors every rank holds; the param group entries are
non-tensor (bytes) items every rank holds. Those whole items are small and written in full,
with their real values (the tools read the ``step`` counters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from devtools.scale.archives import ArchiveTemplate, torch_save_bytes
from devtools.scale.identity import fresh
from devtools.scale.run import OptimizerState
from devtools.scale.shapes import LlamaShape

MODEL_KEY = "model"  # ckpt_tools.format.layout.MODEL_DCP_KEY
OPTIMIZER_KEY = "optimizer"  # ckpt_tools.format.layout.OPTIMIZER_DCP_KEY
ADAM_SLOTS = ("step", "exp_avg", "exp_avg_sq")  # AdamW's own order of its per-parameter state


@dataclass(frozen=True)
class Item:
    """One entry of a flattened state dict."""

    fqn: str
    path: tuple[str | int, ...]  # planner_data: where the entry sits in the nested dict
    shape: tuple[int, ...]
    dtype: torch.dtype | None  # None: a non-tensor item, pickled into a bytes archive
    sharded: bool  # an FSDP2 DTensor, Shard(0) over dp_shard; else every rank holds it whole
    archive: bytes | None = None  # an item written whole: its exact torch.save archive
    # The whole tensor's bytes (0 for a non-tensor): what torch's writer sorts and balances by.
    nbytes: int = field(init=False)
    # ``WriteItem.tensor_storage_size() or 1``: the weight of the de-duplication.
    storage_size: int = field(init=False)
    # An item written whole: its archive as a template with no hole.
    whole: ArchiveTemplate | None = field(init=False)

    def __post_init__(self) -> None:
        n = 0 if self.dtype is None else self.dtype.itemsize * math.prod(self.shape)
        object.__setattr__(self, "nbytes", n)
        object.__setattr__(self, "storage_size", n or 1)
        object.__setattr__(self, "whole", None if self.archive is None else ArchiveTemplate(self.archive, 0, b""))


def model_items(shape: LlamaShape) -> list[Item]:
    top = fresh(MODEL_KEY)  # the paths share their strings as rank 0's plan did (:mod:`.identity`)
    out = []
    for name, dims in shape.parameters():
        out.append(Item(f"{MODEL_KEY}.{name}", (top, fresh(name)), dims, torch.float32, True))
    return out


def optimizer_items(shape: LlamaShape, state: OptimizerState, step: int, crc32: bool) -> list[Item]:
    step_archive = torch_save_bytes(torch.tensor(float(step), dtype=torch.float32), crc32)
    top, per_param, groups = fresh(OPTIMIZER_KEY), fresh("state"), fresh("param_groups")
    slots = {slot: fresh(slot) for slot in ADAM_SLOTS}
    out = []
    for name, dims in shape.parameters():
        shared_name = fresh(name)
        for slot in ADAM_SLOTS:
            fqn, path = f"{OPTIMIZER_KEY}.state.{name}.{slot}", (top, per_param, shared_name, slots[slot])
            if slot == "step":
                out.append(Item(fqn, path, (), torch.float32, False, step_archive))
            else:
                out.append(Item(fqn, path, dims, torch.float32, True))
    for g, group in enumerate(state.param_groups):
        for key, value in group.items():
            fqn, path = f"{OPTIMIZER_KEY}.param_groups.{g}.{key}", (top, groups, g, fresh(key))
            out.append(Item(fqn, path, (), None, False, torch_save_bytes(value, crc32)))
    return out
