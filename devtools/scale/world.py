"""The data-parallel world a checkpoint was saved from, and how FSDP2 splits a tensor over it.

FSDP2 (``fully_shard``) shards every parameter on dim 0 with ``torch.chunk`` semantics: shards
of ``ceil(rows / S)`` rows, so trailing ranks may get fewer rows or none. DCP records each
rank's box as DTensor computes it (``compute_local_shape_and_global_offset``): an empty shard
is the box ``(rows, 0, ...)`` of size ``(0, ...)`` - the same box on every empty rank, which
the save's de-duplication then writes once. HSDP lays ranks out as torch's
``init_device_mesh((R, S))`` does: rank ``r × S + s`` holds shard ``s`` of replica ``r``.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYOUTS = ("fsdp", "hsdp")
RANKS_PER_NODE = 8  # a GPU node; the record's nnodes and the HSDP shard group follow from it


@dataclass(frozen=True)
class World:
    dp_replicate: int
    dp_shard: int

    @property
    def size(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def layout(self) -> str:
        return "hsdp" if self.dp_replicate > 1 else "fsdp"

    @property
    def nnodes(self) -> int:
        return max(1, self.size // RANKS_PER_NODE)

    def label(self) -> str:
        mesh = f"{self.dp_replicate}x{self.dp_shard}" if self.dp_replicate > 1 else f"{self.dp_shard}"
        return f"{self.layout}{mesh}"

    @classmethod
    def of(cls, layout: str, ranks: int, hsdp_shard: int = RANKS_PER_NODE) -> World:
        """FSDP over every rank; HSDP sharded within a node (``hsdp_shard`` ranks), replicated across
        nodes - and, on a single node, two replicas of half a node each."""
        if layout == "fsdp":
            return cls(1, ranks)
        if layout != "hsdp":
            raise ValueError(f"layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
        shard = min(hsdp_shard, ranks // 2)
        if shard < 1 or ranks % shard:
            raise ValueError(f"HSDP over {ranks} ranks cannot have shard groups of {shard}")
        return cls(ranks // shard, shard)

    def halved(self) -> World:
        """The world a resume on half the ranks would use: the shard groups halved, replicas kept."""
        return World(self.dp_replicate, max(1, self.dp_shard // 2))


def shard_box(rows: int, shards: int, index: int) -> tuple[int, int]:
    """(first row, rows) of shard ``index`` of ``rows`` split over ``shards``, as DTensor's Shard(0) says."""
    full = -(-rows // shards)
    start = full * index
    if start >= rows:
        return rows, 0
    return start, min(rows, start + full) - start
