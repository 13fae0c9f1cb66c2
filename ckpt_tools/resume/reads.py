"""The bytes torch's DCP loader asks the file system for, computed from ``.metadata`` alone.

``dcp.load`` with the default planner and ``FileSystemReader`` works like this (torch 2.13,
``planner_helpers.create_read_items_for_chunk_list`` and ``FileSystemReader.read_data``):

- for every tensor of the state dict being loaded, each *local* box the rank holds (a DTensor's
  shard, or the whole tensor) is compared with every *saved* chunk of that tensor; each pair
  that overlaps (DCP's offset test, 0-d tensors always) becomes one read request;
- a request reads the saved chunk's whole storage span - its ``torch.save`` archive, all of
  ``length`` bytes - however small the overlap: resharding never reads partial chunks;
- every non-tensor item (``BYTE_IO``: optimizer hyper-parameters) is read by every rank.

So the bytes a rank reads from a file are the sum of those spans. This module turns a
:class:`~ckpt_tools.dcp.index.ChunkIndex` and the boxes a rank will hold into that sum.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ckpt_tools.dcp.index import Chunk, ChunkIndex
from ckpt_tools.resume.placement import Box, boxes_overlap


@dataclass
class ReadCounter:
    """Per shard file: bytes requested and how many requests, accumulated over tensors."""

    bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, file: str, length: int) -> None:
        self.bytes[file] += length
        self.requests[file] += 1

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


class ChunkLookup:
    """Saved chunks of one DCP directory, sorted along dim 0 for quick overlap queries."""

    def __init__(self, index: ChunkIndex) -> None:
        self.index = index
        self._sorted: dict[str, tuple[list[int], list[Chunk]]] = {}

    def _chunks(self, fqn: str) -> tuple[list[int], list[Chunk]]:
        found = self._sorted.get(fqn)
        if found is None:
            chunks = sorted(self.index.tensors[fqn].chunks, key=lambda c: c.offsets[0] if c.offsets else 0)
            found = ([c.offsets[0] if c.offsets else 0 for c in chunks], chunks)
            self._sorted[fqn] = found
        return found

    def overlapping(self, fqn: str, box: Box) -> list[Chunk]:
        """Saved chunks of ``fqn`` that DCP pairs with the local ``box`` (one read each)."""
        starts, chunks = self._chunks(fqn)
        offsets, sizes = box
        if not offsets:
            return list(chunks)  # 0-d: every saved chunk overlaps
        # Only chunks starting before the box ends along dim 0 can overlap it.
        stop = bisect_left(starts, offsets[0] + sizes[0])
        return [c for c in chunks[:stop] if boxes_overlap(box, (c.offsets, c.sizes))]

    def count(self, wanted: Iterable[tuple[str, Box]], *, byte_items: bool = True) -> ReadCounter:
        """Reads for loading ``(fqn, local box)`` pairs, plus every BYTE_IO item if asked."""
        counter = ReadCounter()
        for fqn, box in wanted:
            for chunk in self.overlapping(fqn, box):
                counter.add(chunk.file, chunk.length)
        if byte_items:
            for item in self.index.byte_items.values():
                counter.add(item.file, item.length)
        return counter
