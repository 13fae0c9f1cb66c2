"""The process group: who we are, on what device, and a teardown that does not abort.

Reads only what the launcher exports (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_WORLD_SIZE``…): torchrun and accelerate launch both set them,
so nothing here is node-aware.
"""

from __future__ import annotations

import datetime
import gc
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ckpt_tools.train.env_guard import env_rank


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str | None  # None: single process without a process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def nnodes(self) -> int | None:
        if self.local_world_size and self.world_size % self.local_world_size == 0:
            return self.world_size // self.local_world_size
        return None


_collective_timeout: datetime.timedelta | None = None  # --collective_timeout_s of this process's group


def collective_timeout() -> datetime.timedelta | None:
    """The run's bound on one collective (None before :func:`init_distributed` made a group)."""
    return _collective_timeout


def bound_by_collective_timeout(groups: list[Any]) -> None:
    """Give groups made after ``init_process_group`` the run's collective timeout.

    torch gives a new group (each dimension of a device mesh, a background save's own group)
    its backend's default instead (30 minutes for gloo, 10 for NCCL), not the world's: an HSDP
    rank that stalls inside FSDP's reduce-scatter, which runs on the mesh's shard group, held
    the others there for half an hour instead of ``--collective_timeout_s``.
    """
    if _collective_timeout is None:
        return
    from torch.distributed.distributed_c10d import _set_pg_timeout

    for group in groups:
        _set_pg_timeout(_collective_timeout, group)


def init_distributed(timeout_s: float = 600.0) -> DistEnv:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = env_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if world_size == 1 and "MASTER_ADDR" not in os.environ:
        return DistEnv(0, 0, 1, 1, device, None)
    global _collective_timeout
    _collective_timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        # A bounded timeout: a rank that dies makes the others fail instead of hanging forever.
        dist.init_process_group(
            backend=backend,
            timeout=_collective_timeout,
            device_id=device if backend == "nccl" else None,
        )
    return DistEnv(rank, local_rank, world_size, local_world, device, backend)


# What the transports say when a peer is gone or silent. gloo raises a plain RuntimeError for
# a collective that times out inside autograd hooks (FSDP's reduce-scatter), not a DistError.
_TRANSPORT_FAILURES = (
    "Timed out waiting",
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "gloo/transport",
    "Application timeout caused pair closure",  # gloo, when a peer stalled past the timeout mid-transfer
    "NCCL communicator was aborted",
    "Watchdog caught collective operation timeout",
)


def is_transport_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed because another rank died or stalled."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(marker in text for marker in _TRANSPORT_FAILURES)


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def teardown(env: DistEnv) -> None:
    """Drop references, collect, then destroy the group.

    gloo worker threads that free work during interpreter shutdown abort the process
    ("terminate called without an active exception") after correct work; collecting first
    removed those aborts in our measurements.
    """
    gc.collect()
    if env.distributed and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    gc.collect()
