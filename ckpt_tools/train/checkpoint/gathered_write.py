"""The gathered ``model.safetensors`` of a sharded run, written in place by every rank.

FSDP2 shards each parameter along dim 0, and the rows of a row-major tensor are one
contiguous byte range of its safetensors payload. So nothing needs gathering: the main rank
lays the file out (header, then the file extended to its full size), and every rank of the
first replica ``pwrite``s its own rows at their offsets, in parallel, straight from its
local shard; the main rank adds the tensors that are not dim-0 sharded (0-d scalars,
modules kept unsharded). No rank ever holds more than its own shard, and the bytes cross
no network - the same shared-directory assumption DCP itself makes.

The file lives inside the checkpoint's hidden partial directory, so it is invisible until
the whole checkpoint is committed. Every rank that wrote rows fsyncs it before the closing
barrier: on a file system shared between nodes a rank can only make its own pages durable.

Each range a rank writes (the header, its rows of a tensor, a whole tensor) is digested from
the very buffer it ``pwrite``s (:class:`~ckpt_tools.train.checkpoint.written_digests.WrittenDigests`):
no rank sees the whole file, so the record keeps one digest per range.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from ckpt_tools.errors import CheckpointError, WriteError
from ckpt_tools.io import digest
from ckpt_tools.io.fsutil import FILE_MODE
from ckpt_tools.st.writer import build_header, describe_os_error
from ckpt_tools.train.checkpoint.written_digests import WrittenDigests
from ckpt_tools.train.parallel.distributed import DistEnv
from ckpt_tools.train.parallel.wrap import ParallelModel
from ckpt_tools.train.safetensors_io import as_bytes, tensor_to_write


@dataclass(frozen=True)
class RowWriter:
    """Which rows this rank writes: its index in its dp_shard group, and whether it writes at all."""

    is_main: bool
    shard_index: int = 0
    shard_count: int = 1
    writes_shards: bool = True  # False for HSDP replicas other than the first (same bytes)
    background: bool = False  # a background save must not use the training mesh's collectives

    @classmethod
    def for_run(cls, parallel: ParallelModel, env: DistEnv, background: bool = False) -> RowWriter:
        mesh = parallel.mesh
        if not parallel.sharded or mesh is None:
            return cls(is_main=env.is_main, background=background)
        names = mesh.mesh_dim_names or ()
        first_replica = "dp_replicate" not in names or mesh.get_local_rank("dp_replicate") == 0
        return cls(env.is_main, mesh.get_local_rank("dp_shard"), parallel.dp_shard, first_replica, background)


def dim0_sharded(tensor: torch.Tensor) -> bool:
    """Sharded along dim 0 over ``dp_shard`` and replicated over every other mesh dim (FSDP2's layout)."""
    if not isinstance(tensor, DTensor) or tensor.ndim == 0:
        return False
    names = tensor.device_mesh.mesh_dim_names or ()
    for name, placement in zip(names, tensor.placements, strict=True):
        if name == "dp_shard":
            if not (isinstance(placement, Shard) and placement.dim == 0):
                return False
        elif not isinstance(placement, Replicate):
            return False
    return True


def write_gathered(
    state: dict[str, Any],
    path: Path,
    writer: RowWriter,
    barrier: Callable[[], None],
    metadata: dict[str, str],
    written: WrittenDigests | None = None,
) -> None:
    """Collective: ``state`` (DTensor shards and plain tensors) as one safetensors file at ``path``;
    each range this rank writes gets its digest in ``written``."""
    ranges = _Ranges(path, written)
    specs = [tensor_to_write(name, t) for name, t in state.items()]
    header = build_header(specs, metadata)
    offsets, position = [], len(header)
    for spec in specs:
        offsets.append(position)
        position += spec.nbytes
    if writer.is_main:
        _create(path, header, position)
        ranges.add(memoryview(header), 0)
    barrier()
    fd = os.open(path, os.O_WRONLY)
    try:
        for (name, tensor), offset in zip(state.items(), offsets, strict=True):
            _write_tensor(fd, path, name, tensor, offset, writer, ranges)
        if writer.writes_shards or writer.is_main:
            os.fsync(fd)  # this rank's pages: on a shared file system no other rank can flush them
    except OSError as e:
        raise WriteError(describe_os_error(path, e)) from None
    finally:
        os.close(fd)
    barrier()


def _create(path: Path, header: bytes, size: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)  # the umask applies, as for DCP
        try:
            _pwrite_all(fd, memoryview(header), 0)
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
    except OSError as e:
        raise WriteError(describe_os_error(path, e)) from None


class _Ranges:
    """Digests of the ranges this rank writes, reported into ``written`` (nothing without it)."""

    def __init__(self, path: Path, written: WrittenDigests | None) -> None:
        self.path = path
        self.written = written if written is not None and written.enabled else None

    def add(self, data: memoryview, offset: int) -> None:
        if self.written is not None and data.nbytes:
            started = time.perf_counter()
            hexdigest = digest.of_bytes(data)
            self.written.piece(self.path, offset, data.nbytes, hexdigest, time.perf_counter() - started)


def _write_tensor(
    fd: int, path: Path, name: str, tensor: torch.Tensor, offset: int, writer: RowWriter, ranges: _Ranges
) -> None:
    if dim0_sharded(tensor):
        if not writer.writes_shards:
            return
        local = cast(DTensor, tensor).to_local()
        rows = tensor.shape[0]
        per_rank = math.ceil(rows / writer.shard_count)  # torch.chunk: ceil-sized chunks, short or empty tail
        start = min(rows, writer.shard_index * per_rank)
        if local.shape[0] != min(per_rank, rows - start):
            raise CheckpointError(f"{name}: local shard of {local.shape[0]} rows does not match FSDP's placement")
        row_bytes = (tensor.numel() // rows if rows else 0) * tensor.element_size()
        _write_range(fd, as_bytes(local), offset + start * row_bytes, ranges)
        return
    if isinstance(tensor, DTensor) and not all(isinstance(p, Replicate) for p in tensor.placements):
        if writer.background:  # the training mesh's collectives belong to the loop's thread
            raise CheckpointError(f"{name}: --checkpoint_async saves dim-0 sharded tensors only ({tensor.placements})")
        full = tensor.full_tensor()  # another layout: torch's own all-gather
        if writer.is_main:
            _write_range(fd, as_bytes(full), offset, ranges)
        return
    if writer.is_main:
        whole = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        _write_range(fd, as_bytes(whole), offset, ranges)


def _write_range(fd: int, data: memoryview, offset: int, ranges: _Ranges) -> None:
    ranges.add(data, offset)
    _pwrite_all(fd, data, offset)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written
