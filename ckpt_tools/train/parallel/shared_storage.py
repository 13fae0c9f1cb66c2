"""One output directory seen alike by every rank: what multi-node checkpoints rest on.

Every rank writes its own DCP shards and rank 0 commits the step directory and moves ``last``;
a checkpoint is complete only if all of it lands in one filesystem that every node sees (NFS,
Lustre, a cloud file share). Where a node's ``--output_dir`` is a local disk instead, each node
would write pieces of checkpoints that only look complete. Both checks run at start-up,
before anything is written, and refuse on every rank with the same line.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from ckpt_tools.errors import ConfigError
from ckpt_tools.io.dir_lock import DirLock, DirLocked
from ckpt_tools.train.parallel.distributed import DistEnv

PROBE_PREFIX = ".ckpt-tools-shared-storage-probe-"


def same_resume_on_every_rank(env: DistEnv, resume_from: Path | None) -> None:
    """Collective: refuse, on every rank, a launch whose ranks chose different checkpoints (or none).

    Each rank resolves ``--config_path`` / ``--resume=auto`` from the files before the process
    group exists; on storage that is not shared, or not coherent across nodes, two ranks could
    see different ``last`` links and restore different states without an error.
    """
    if not env.distributed:
        return
    import torch.distributed as dist

    seen: list[str | None] = [None] * env.world_size
    dist.all_gather_object(seen, None if resume_from is None else str(resume_from))
    if len(set(seen)) > 1:
        shown = ", ".join(f"rank {r}: {s or 'a new run'}" for r, s in enumerate(seen))
        raise ConfigError(
            f"the ranks do not agree on what to resume ({shown}); every rank must see the same --output_dir"
            " (shared storage)"
        )


@contextlib.contextmanager
def own_output_dir(env: DistEnv, output_dir: Path) -> Iterator[DirLock | None]:
    """Collective: the main rank owns ``output_dir`` for the run (:mod:`ckpt_tools.io.dir_lock`), or every rank
    refuses with the line naming the run that does; released when the run ends, however it ends.

    Taken before the check that a new run's directory holds no checkpoints, so that check and
    the saves after it cannot interleave with another run's.
    """
    lock, line = None, None
    if env.is_main:
        lock = DirLock(output_dir, "ckpt-train")
        try:
            lock.acquire()
        except DirLocked as e:
            lock, line = None, f"--output_dir={e}; one run per output directory: wait for it to end, or choose another"
        except OSError as e:
            lock, line = None, f"--output_dir={output_dir}: cannot take its lock ({e.strerror or e})"
    if env.distributed:
        import torch.distributed as dist

        holder: list[str | None] = [line]
        dist.broadcast_object_list(holder, src=0)
        line = holder[0]
    if line is not None:
        raise ConfigError(line)
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


def require_shared_output_dir(env: DistEnv, output_dir: Path) -> None:
    """Collective: rank 0 writes a probe file into ``output_dir``; every rank must read it back.

    A rank that cannot (its node has its own disk at that path) stops the launch on every
    rank with one line naming the ranks and hosts that do not share the directory.
    """
    if not env.distributed:
        return
    import torch.distributed as dist

    token = secrets.token_hex(8)
    holder: list[str | None] = [token if env.is_main else None]
    dist.broadcast_object_list(holder, src=0)
    token = str(holder[0])
    probe = output_dir / f"{PROBE_PREFIX}{token}"
    if env.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text(token)
    dist.barrier()
    sees = _reads(probe, token)
    views: list[tuple[bool, str] | None] = [None] * env.world_size
    dist.all_gather_object(views, (sees, socket.gethostname()))
    dist.barrier()  # every rank has looked before the probe goes
    if env.is_main:
        probe.unlink(missing_ok=True)
    blind = [(rank, view[1]) for rank, view in enumerate(views) if view is not None and not view[0]]
    if blind:
        shown = ", ".join(f"rank {rank} on {host}" for rank, host in blind)
        raise ConfigError(
            f"--output_dir={output_dir} is not one shared filesystem: {shown} cannot see the file rank 0 wrote"
            " there; every node must see the same directory (a network or cluster filesystem), or its"
            " checkpoints would only look complete"
        )


def _reads(probe: Path, token: str, patience_s: float = 2.0) -> bool:
    """Does this rank read ``token`` from ``probe``? A network filesystem may show a file
    another node just created only after its attribute cache expires: look again for a moment."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            if probe.read_text() == token:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
