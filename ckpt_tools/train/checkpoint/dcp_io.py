"""DCP save and load as a checkpoint does them: tuned writes, a reader that runs no code.

:func:`dcp_save` and :func:`dcp_load` are the pair every DCP part of a checkpoint (the model's
``pytorch_model_fsdp_0/``, the optimizer's ``optimizer_0/``) goes through. The save skips the
per-chunk CRC32, caches its plan, writes with a thread per free core and starts disk writeback
as each shard file grows; the load unpickles ``.metadata`` data-only before torch sees it and
counts the bytes it requests (the resume audit).
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import StorageMeta

from ckpt_tools.errors import CheckpointError
from ckpt_tools.format.layout import DCP_SHARD_SUFFIX
from ckpt_tools.io.writeback import WritebackFile
from ckpt_tools.train.checkpoint import writer_threads
from ckpt_tools.train.checkpoint.audit import CountingReader
from ckpt_tools.train.checkpoint.safe_dcp import SafeLoadPlanner, directory_torch_metadata
from ckpt_tools.train.checkpoint.save_index import write_save_index
from ckpt_tools.train.checkpoint.written_digests import WrittenDigests

# ====================================================================== save


def dcp_save(
    state: dict[str, Any],
    directory: Path,
    group: Any,
    written: WrittenDigests | None = None,
    save_id: str | None = None,
) -> None:
    """``dcp.save`` into ``directory``: no per-chunk CRC32, cached plans, a writer thread per free
    core, disk writeback started as the shard file grows (:class:`WritebackFileSystemWriter`);
    then the coordinator indexes it (``.metadata.index``, :mod:`~ckpt_tools.train.checkpoint.save_index`).
    Each shard file's full digest goes into ``written`` as it is written; ``save_id`` is stamped
    into ``.metadata`` (``storage_meta.save_id``).

    Each DCP chunk is a ``torch.save`` zip record; computing its CRC32 costs a large share of
    the save on CPU, and nothing ever verifies it on load (torch, accelerate and our reader
    check structure and sizes instead). Durability comes from the fsync of every file.

    The save plan (one entry per tensor chunk: ~1 000 per rank for a policy and its AdamW
    state) is the same at every save of a run, yet plain ``dcp.save`` pickles every rank's
    plan to the coordinator and the global plan back each time - a large share of the save's
    non-writing time in a profile. With plan caching each rank only says "unchanged".
    """
    from torch.utils.serialization import config

    (key,) = state  # the model or the optimizer: each keeps its own cached plan
    previous = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        writer = WritebackFileSystemWriter(directory, writer_threads_per_rank(), written, save_id)
        with writer_threads.watched():  # torch drops its writer threads' failures
            metadata = dcp.save(state, storage_writer=writer, planner=CachedPlanSavePlanner(key), process_group=group)
    finally:
        config.save.compute_crc32 = previous
    if not dist.is_initialized() or dist.get_rank(group) == 0:  # the coordinator that wrote .metadata
        write_save_index(directory, metadata)


def os_error_in(error: BaseException) -> OSError | None:
    """The first ``OSError`` in a DCP failure: in its per-rank failures, or along their chains."""
    failures = list(getattr(error, "failures", {}).values()) or [error]
    for failure in failures:
        cause = writer_threads.root_cause(failure[0] if isinstance(failure, tuple) else failure)
        if isinstance(cause, OSError):
            return cause
    return None


def writer_threads_per_rank() -> int:
    """DCP writer threads for this rank: the cores each local rank has to itself, 1 to 4.

    Each thread serializes and writes its own shard file; threads beyond the free cores only
    contend (measured in docs/benchmarks.md).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, min(4, cores // local_ranks))


class WritebackFileSystem(FileSystem):
    """torch's local file system for DCP, whose new files start their disk writeback as they grow.

    With ``written``, each shard file reports its full digest there as it is closed (the
    ``.metadata`` torch writes under a temporary name is digested by the commit).
    """

    def __init__(self, written: WrittenDigests | None = None) -> None:
        super().__init__()
        self.written = written if written is not None and written.enabled else None

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        on_close = None
        if self.written is not None and str(path).endswith(DCP_SHARD_SUFFIX):
            log = self.written

            def on_close(size: int, hexdigest: str, seconds: float) -> None:
                log.whole(path, size, hexdigest, seconds)

        with WritebackFile(path, on_close=on_close) as stream:
            yield cast(io.IOBase, stream)


class WritebackFileSystemWriter(dcp.FileSystemWriter):
    """DCP's file writer whose shard files overlap their disk writing with their serialization.

    Plain DCP serializes a rank's whole shard file into the page cache, then fsyncs it: the
    disk idles during the copy and the copy waits during the fsync. Here the disk takes each
    32 MiB as soon as it is serialized (:mod:`ckpt_tools.io.writeback`); the files, their bytes
    and the fsync of each are those of the plain writer.
    """

    def __init__(
        self, path: Path, thread_count: int, written: WrittenDigests | None = None, save_id: str | None = None
    ) -> None:
        super().__init__(path, thread_count=thread_count)
        self.fs = WritebackFileSystem(written)
        self.stamp = save_id

    def storage_meta(self) -> StorageMeta | None:
        """torch's, with the checkpoint's save id as ``save_id`` (torch makes up one per ``dcp.save``)."""
        meta = super().storage_meta()
        if meta is not None and self.stamp is not None:
            meta.save_id = self.stamp
        return meta


class CachedPlanSavePlanner(DefaultSavePlanner):
    """torch's default save planner with plan caching, cached under its own key per state.

    torch keys the cache by planner class name alone; two states saved alternately (model,
    optimizer) would evict each other's plan at every save. A changed plan is detected by
    comparison and simply re-sent, so a stale cache costs one full exchange, never a wrong plan.
    """

    def __init__(self, key: str) -> None:
        super().__init__(enable_plan_caching=True)
        self._cached_plans_key = f"{type(self).__name__}:{key}"


# ====================================================================== load


def dcp_load(state: dict[str, Any], directory: Path, step_root: Path) -> dict[str, int]:
    """Collective: ``dcp.load`` of ``state`` from ``directory``; returns the bytes requested per file.

    ``.metadata`` is validated and unpickled data-only before torch sees it (torch would
    ``pickle.load`` it). The returned spans are keyed by path relative to ``step_root``.
    """
    reader = CountingReader(directory, directory_torch_metadata(directory, state))
    try:
        with warnings.catch_warnings():
            # A single-process resume from shards is intended; torch warns about it regardless.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=not dist.is_initialized())
    except (Exception, dcp.CheckpointException) as e:  # CheckpointException is a BaseException
        raise _dcp_error(directory, e) from None
    prefix = directory.relative_to(step_root)
    return {str(prefix / name): length for name, length in reader.requested.items()}


def _dcp_error(directory: Path, error: BaseException) -> CheckpointError:
    last = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    return CheckpointError(f"{directory}: DCP load failed ({last[:300]})")
