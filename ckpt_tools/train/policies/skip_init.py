"""A resumed policy is built without its random init: the checkpoint overwrites every value.

A fresh policy draws each weight from torch's initializers (``kaiming_uniform_`` and the like),
and an FSDP layout then copies each full weight into this rank's shard. On a resume both are
wasted work: the load writes every parameter and persistent buffer (DCP's planner refuses a
checkpoint that lacks one, and :mod:`ckpt_tools.dcp.validate` one whose chunks leave an
element uncovered). So a resume builds the policy on torch's ``meta`` device (shapes only, no
memory, no init), lays it out, and only then allocates the storage (:func:`materialize`):
uninitialized memory, sharded already under FSDP, that the load fills.

What the checkpoint does not hold must still come out right, so the ordinary build is kept when

- the run is not a plain resume: a new run needs its init, and a PEFT run or one from
  ``--policy.path`` takes its frozen weights from elsewhere than the checkpoint;
- the policy has non-persistent buffers (computed in ``__init__``, never saved);
- it has tied parameters: materializing a plain module allocates each name on its own and
  would untie them.

The random generator's state after the build does not matter: the training core reseeds it
right after the build (and a resume on the same world size restores the saved one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def skips_init(resuming: bool, peft: bool, from_path: bool) -> bool:
    """Whether every value of the policy comes from the checkpoint being resumed."""
    return resuming and not peft and not from_path


def build_on_meta(make: Callable[[], M]) -> M | None:
    """``make()`` on the meta device, or None when the policy needs its ordinary build (see above)."""
    with torch.device("meta"):
        model = make()
    if any(m._non_persistent_buffers_set for m in model.modules()):
        return None
    seen: set[int] = set()
    for _, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            return None
        seen.add(id(param))
    return model


def is_on_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def materialize(model: nn.Module, device: torch.device) -> None:
    """Give a meta model (laid out or not) uninitialized storage on ``device``, for a load to fill."""
    model.to_empty(device=device)
