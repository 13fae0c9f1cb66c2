"""The bytes torch's DCP loader asks the file system for, computed from the chunk table alone.

``dcp.load`` with the default planner and ``FileSystemReader`` works like this (torch 2.13,
``planner_helpers.create_read_items_for_chunk_list`` and ``FileSystemReader.read_data``):

- for every tensor of the state dict being loaded, each *local* box the rank holds (a DTensor's
  shard, or the whole tensor) is compared with every *saved* chunk of that tensor; each pair
  that overlaps (DCP's offset test, 0-d tensors always) becomes one read request;
- a request reads the saved chunk's whole storage span - its ``torch.save`` archive, all of
  ``length`` bytes - however small the overlap: resharding never reads partial chunks;
- every non-tensor item (``BYTE_IO``: optimizer hyper-parameters) is read by every rank.

So the bytes a rank reads from a file are the sum of those spans. Here that sum is computed
for many ranks at once, in columns: a local box under DDP, FSDP2 or HSDP is a range of rows
along dim 0 and whole along the others (:mod:`ckpt_tools.resume.placement`), so for each
tensor the saved chunks it overlaps are found by binary search over the chunks sorted along
dim 0, for every rank in one numpy call - linear in the chunks and ranks, where comparing
every rank's box with every chunk would be their product.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ckpt_tools.dcp.table import ChunkTable


@dataclass(frozen=True)
class Wanted:
    """One tensor a resume loads: on shard ``k`` the rows ``start[k] .. start[k]+rows[k]`` along dim 0.

    Whole along every other dimension; a 0-d tensor's arrays are ignored (it overlaps every chunk).
    """

    tensor: int  # index in the table
    start: np.ndarray  # int64 [shards]
    rows: np.ndarray  # int64 [shards]


@dataclass(frozen=True)
class Reads:
    """Bytes and requests per (shard, file), for the shards asked about: sparse columns."""

    shard: np.ndarray
    file: np.ndarray  # index into ChunkTable.files, or -1 - i for the i-th non-tensor item's file
    bytes: np.ndarray
    requests: np.ndarray

    def of_shard(self, k: int, files: list[str], byte_files: list[str]) -> dict[str, tuple[int, int]]:
        """File name -> (bytes, requests) of shard ``k``."""
        out: dict[str, tuple[int, int]] = {}
        lo, hi = np.searchsorted(self.shard, [k, k + 1])
        for f, b, r in zip(
            self.file[lo:hi].tolist(), self.bytes[lo:hi].tolist(), self.requests[lo:hi].tolist(), strict=True
        ):
            name = files[f] if f >= 0 else byte_files[-1 - f]
            have = out.get(name, (0, 0))
            out[name] = (have[0] + b, have[1] + r)
        return out


def overlapping(table: ChunkTable, wanted: Wanted) -> tuple[np.ndarray, np.ndarray]:
    """(shard, row) pairs: each saved chunk of ``wanted.tensor`` that shard's box overlaps (DCP's test)."""
    t = wanted.tensor
    rows = table.rows_of(t)
    idx = np.arange(rows.start, rows.stop, dtype=np.int64)
    idx = idx[table.file[idx] >= 0]  # chunks without a storage entry are validation's problem
    shards = int(wanted.start.shape[0])
    shape = table.shapes[t]
    if idx.size == 0 or shards == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if not shape:  # 0-d: every box overlaps every chunk
        return np.repeat(np.arange(shards, dtype=np.int64), idx.size), np.tile(idx, shards)
    offsets, sizes = table.offsets[idx], table.sizes[idx]
    ndim = len(shape)
    # Along every dim but 0 the box is whole: a chunk passes DCP's test there when it starts
    # before the end of the dim and does not end at offset 0.
    rest = np.ones(idx.size, dtype=bool)
    for d in range(1, ndim):
        rest &= (offsets[:, d] + sizes[:, d] > 0) & (offsets[:, d] < shape[d])
    idx, a = idx[rest], offsets[rest, 0]
    b = a + sizes[rest, 0]
    if idx.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    box_start, box_end = wanted.start, wanted.start + wanted.rows
    order = np.argsort(a, kind="stable")
    a, b, idx = a[order], b[order], idx[order]
    if np.all(b[1:] >= b[:-1]):  # ends in the same order as starts (every layout DCP saves along dim 0)
        hi = np.searchsorted(a, box_end, side="left")  # chunks starting before the box ends
        lo = np.searchsorted(b, box_start, side="right")  # chunks ending at or before the box starts
        counts = np.maximum(hi - lo, 0)
        shard = np.repeat(np.arange(shards, dtype=np.int64), counts)
        first = np.repeat(lo - np.cumsum(counts) + counts, counts)
        return shard, idx[first + np.arange(shard.size, dtype=np.int64)]
    hit = (a[None, :] < box_end[:, None]) & (box_start[:, None] < b[None, :])  # a few chunks split two ways
    shard, j = np.nonzero(hit)
    return shard.astype(np.int64), idx[j]


def count_reads(table: ChunkTable, wanted: list[Wanted], shards: int, *, byte_items: bool = True) -> Reads:
    """What each of ``shards`` boxes reads to load ``wanted``, plus every non-tensor item if asked."""
    pair_shard, pair_row = [], []
    for w in wanted:
        s, r = overlapping(table, w)
        pair_shard.append(s)
        pair_row.append(r)
    shard = np.concatenate(pair_shard) if pair_shard else np.zeros(0, dtype=np.int64)
    row = np.concatenate(pair_row) if pair_row else np.zeros(0, dtype=np.int64)
    file, length = table.file[row], table.length[row]
    if byte_items:
        items = [(i, b.length) for i, b in enumerate(table.byte_items) if b.file is not None]
        if items:
            ids = np.asarray([-1 - i for i, _ in items], dtype=np.int64)
            lengths = np.asarray([n for _, n in items], dtype=np.int64)
            shard = np.concatenate([shard, np.repeat(np.arange(shards, dtype=np.int64), len(items))])
            file = np.concatenate([file, np.tile(ids, shards)])
            length = np.concatenate([length, np.tile(lengths, shards)])
    return _totals(shard, file, length)


def _totals(shard: np.ndarray, file: np.ndarray, length: np.ndarray) -> Reads:
    if shard.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Reads(empty, empty, empty, empty)
    order = np.lexsort((file, shard))
    shard, file, length = shard[order], file[order], length[order]
    new = np.ones(shard.size, dtype=bool)
    new[1:] = (shard[1:] != shard[:-1]) | (file[1:] != file[:-1])
    starts = np.flatnonzero(new)
    running = np.zeros(length.size + 1, dtype=np.int64)
    np.cumsum(length, out=running[1:])
    ends = np.append(starts[1:], length.size)
    return Reads(shard[starts], file[starts], running[ends] - running[starts], ends - starts)
