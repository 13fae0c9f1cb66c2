"""The commit gate: a checkpoint whose weights or optimizer state hold NaN or ±inf is not saved.

Such a checkpoint would become ``last``, and every resume and published policy from it would
be NaN. The loop stops at a non-finite loss before its update, so this is the last line: a
finite loss whose update still overflowed (an enormous learning rate), or a NaN that came
from anywhere else. Each rank checks its own shards - ``isfinite().all()`` per tensor, on the
device, one flag each - and a max all-reduce of the flags gives every rank the same list, so
all of them refuse together and none waits in the save's collectives for the others.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ckpt_tools.train.parallel.distributed import DistEnv

SHOWN = 3  # tensor names a refusal line lists


def floating_tensors(state: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, local tensor) for every floating-point tensor of a state tree, in a rank-independent order."""
    if isinstance(state, DTensor):
        state = state.to_local()
    if isinstance(state, torch.Tensor):
        if state.is_floating_point():
            yield prefix, state.detach()
    elif isinstance(state, Mapping):
        for key, value in state.items():
            yield from floating_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            yield from floating_tensors(value, f"{prefix}.{i}")


def nonfinite_names(env: DistEnv, parts: Mapping[str, Any]) -> tuple[list[str], int]:
    """Collective: the tensors of ``parts`` (name → state tree) holding a NaN or ±inf on any rank,
    and how many tensors were checked."""
    named = [item for part, state in parts.items() for item in floating_tensors(state, part)]
    if not named:
        return [], 0
    flags = torch.stack([(~torch.isfinite(t).all()).to(env.device) for _, t in named]).to(torch.int32)
    if env.distributed:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    bad = flags.nonzero().flatten().tolist()
    return [named[i][0] for i in bad], len(named)


def refusal(step: int, bad: list[str], total: int, last: str) -> str:
    """The one line a refused save ends the run with."""
    shown = ", ".join(bad[:SHOWN]) + (f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else "")
    return (
        f"step {step}: checkpoint not saved: {len(bad)} of {total} tensors hold NaN or infinite values ({shown});"
        f" last complete checkpoint: {last} (lower --optimizer.lr or check the dataset)"
    )
