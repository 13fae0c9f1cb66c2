"""Where a tensor's elements live on each rank of a DDP / FSDP2 / HSDP topology - without torch.

FSDP2 (``fully_shard``) turns every managed parameter into a DTensor with ``Shard(0)`` on the
``dp_shard`` mesh dimension (HSDP adds ``Replicate()`` on ``dp_replicate``). Its local piece is
what ``torch.chunk(param, S, dim=0)`` gives, padded with empty pieces: a chunk size of
``ceil(dim0 / S)``, a shorter tail, and empty trailing shards when ``dim0`` is small. DTensor
reports an empty shard at offset ``dim0``, which matters: it is why an empty shard overlaps no
saved chunk and reads nothing on resume. The HSDP mesh is ``(dp_replicate, dp_shard)`` in
row-major order, so rank ``r`` sits at ``(r // S, r % S)``.

Optimizer state follows its parameter (``exp_avg`` is created ``zeros_like(param)``); 0-d
tensors such as Adam's ``step`` are plain tensors, whole on every rank. Without sharding
(single process, DDP) every rank holds everything.

This mirrors ``torch.distributed.tensor.placement_types.Shard.local_shard_size_and_offset``
(torch 2.13); the reshard-plan tests hold it against what the training core really holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ckpt_tools.format.record import Topology
from ckpt_tools.st.dtypes import numel

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes), DCP's ChunkStorageMetadata


def dim0_shard(dim0: int, num_shards: int, index: int) -> tuple[int, int]:
    """(offset, rows) of shard ``index`` of ``num_shards`` along a dimension of ``dim0`` rows."""
    if num_shards <= 0 or not 0 <= index < num_shards:
        raise ValueError(f"shard {index} of {num_shards}")
    if dim0 % num_shards == 0:
        rows = dim0 // num_shards
        return rows * index, rows
    chunk = -(-dim0 // num_shards)  # ceil, as torch.chunk
    start = chunk * index
    end = min(dim0, start + chunk)
    return min(dim0, start), max(0, end - start)


def dim0_breaks(dim0: int, num_shards: int, saved: Iterable[tuple[int, int]] = ()) -> set[int]:
    """Shard indices at which what a shard holds of a ``dim0``-row tensor, or what it reads, can change.

    Shards ``0 … num_shards-1`` hold equal chunks of ``ceil(dim0 / num_shards)`` rows, then a
    shorter tail, then nothing; so, for the shards from one returned index up to the next, the
    local row count is the same, and so is the set of ``saved`` row ranges ``(start, stop)``
    (the saved chunks along dim 0) they overlap - shard ``i`` overlaps ``[a, b)`` exactly when
    ``a // chunk <= i < ceil(b / chunk)``. The returned set is small (three indices plus two per
    saved range) however many shards there are: a plan evaluates one shard per interval instead
    of every rank.
    """
    if num_shards <= 1 or dim0 <= 0:
        return {0}
    chunk = -(-dim0 // num_shards)
    filled = -(-dim0 // chunk)  # shards holding at least one row
    out = {0, filled - 1, filled}
    for start, stop in saved:
        out.add(start // chunk)
        out.add(-(-stop // chunk))
    return {b for b in out if 0 <= b <= num_shards}


def dim0_shards(dim0: int, num_shards: int, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dim0_shard` for many shard indices at once: (offsets, rows) arrays."""
    if dim0 % num_shards == 0:
        rows = dim0 // num_shards
        return index * rows, np.full(index.shape, rows, dtype=np.int64)
    chunk = -(-dim0 // num_shards)
    start = np.minimum(dim0, chunk * index)
    end = np.minimum(dim0, chunk * index + chunk)
    return start, np.maximum(0, end - start)


def dim0_breaks_of(dim0: int, num_shards: int, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """:func:`dim0_breaks` for saved row ranges given as arrays."""
    if num_shards <= 1 or dim0 <= 0:
        return np.zeros(1, dtype=np.int64)
    chunk = -(-dim0 // num_shards)
    filled = -(-dim0 // chunk)
    out = np.concatenate([[0, filled - 1, filled], starts // chunk, -(-stops // chunk)])
    return out[(out >= 0) & (out <= num_shards)]


def local_rows(
    shape: tuple[int, ...], topology: Topology, index: np.ndarray, *, sharded: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Along dim 0, (offset, rows) of what each shard ``index`` holds of ``shape`` (:func:`local_box`)."""
    if sharded and shape and topology.layout.sharded:
        return dim0_shards(shape[0], topology.dp_shard, index)
    rows = shape[0] if shape else 1
    return np.zeros(index.shape, dtype=np.int64), np.full(index.shape, rows, dtype=np.int64)


@dataclass(frozen=True)
class RankCoordinate:
    """A rank's place in the data-parallel mesh."""

    rank: int
    replica: int  # index along dp_replicate
    shard: int  # index along dp_shard
    node: int | None = None  # which node, when the number of nodes is known


def coordinates(topology: Topology) -> list[RankCoordinate]:
    """Every rank's (replica, shard) coordinate, and its node when ``nnodes`` divides the world.

    torchrun numbers ranks node by node, so node ``k`` holds ranks ``k·L … (k+1)·L - 1`` with
    ``L = world_size / nnodes`` processes per node.
    """
    s = topology.dp_shard
    per_node = None
    if topology.nnodes and topology.world_size % topology.nnodes == 0:
        per_node = topology.world_size // topology.nnodes
    return [
        RankCoordinate(r, r // s, r % s, None if per_node is None else r // per_node)
        for r in range(topology.world_size)
    ]


def local_box(shape: tuple[int, ...], topology: Topology, rank: int, *, sharded: bool) -> Box:
    """The box of ``shape`` that ``rank`` holds; ``sharded`` says whether FSDP manages the tensor."""
    offsets = [0] * len(shape)
    sizes = list(shape)
    if sharded and shape and topology.layout.sharded:
        offsets[0], sizes[0] = dim0_shard(shape[0], topology.dp_shard, rank % topology.dp_shard)
    return tuple(offsets), tuple(sizes)


def box_numel(box: Box) -> int:
    return numel(box[1])


def boxes_overlap(a: Box, b: Box) -> bool:
    """DCP's overlap test (``_check_shard_metadata_pair_overlap``): 0-d boxes always overlap.

    Note the test is on offsets, not volume: an empty box inside another one counts as
    overlapping, which is why the DTensor offset of an empty shard (``dim0``) matters.
    """
    return all(ao < bo + bsz and bo < ao + asz for ao, asz, bo, bsz in zip(a[0], a[1], b[0], b[1], strict=True))
