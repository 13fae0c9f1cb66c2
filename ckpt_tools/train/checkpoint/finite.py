"""The commit gate: a checkpoint whose weights or optimizer state hold NaN or ±inf is not saved.

Such a checkpoint would become ``last``, and every resume and published policy from it would
be NaN. The loop stops at a non-finite loss before its update, so this is the last line: a
finite loss whose update still overflowed (an enormous learning rate), or a NaN that came
from anywhere else. Each rank checks its own shards, one flag per tensor, and a max
all-reduce of the flags gives every rank the same list, so all of them refuse together and
none waits in the save's collectives for the others.

The check is a sum per tensor (float32 accumulation for 16-bit types): any NaN or infinity
makes it non-finite, and a reduction runs an order of magnitude faster than
``isfinite().all()`` (which writes a bool per element) - 3.3 GB/s against 0.23 GB/s on one
CPU core. Only a tensor whose sum is not finite is looked at element by element, so a sum
that merely overflowed refuses nothing.
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
    sums = torch.stack([_sum(t).to(env.device) for _, t in named])
    flags = (~torch.isfinite(sums)).to(torch.int32)
    for i in flags.nonzero().flatten().tolist():  # confirm: a finite tensor's sum may overflow
        flags[i] = int(not bool(torch.isfinite(named[i][1]).all()))
    if env.distributed:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    bad = flags.nonzero().flatten().tolist()
    return [named[i][0] for i in bad], len(named)


def _sum(t: torch.Tensor) -> torch.Tensor:
    return t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)


def refusal(step: int, bad: list[str], total: int, last: str) -> str:
    """The one line a refused save ends the run with."""
    shown = ", ".join(bad[:SHOWN]) + (f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else "")
    return (
        f"step {step}: checkpoint not saved: {len(bad)} of {total} tensors hold NaN or infinite values ({shown});"
        f" last complete checkpoint: {last} (lower --optimizer.lr or check the dataset)"
    )
