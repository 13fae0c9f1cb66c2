"""What a generated checkpoint will hold and take, from the shapes alone - before (and without) torch.

The benchmark decides from these whether a size fits the machine without importing torch: its
own process must stay small, since a child's peak memory as the kernel reports it starts from
the parent's (see :mod:`devtools.scale.measure`).
"""

from __future__ import annotations

from devtools.scale.shapes import LlamaShape
from devtools.scale.world import World, shard_box

DISK_PER_CHUNK = 8 * 1024  # a sparse chunk's head and tail pages
DISK_MARGIN = 1 * 2**30


def chunk_count(shape: LlamaShape, world: World) -> int:
    """Tensor chunks the two ``.metadata`` will list: every non-empty shard, one box for all empty ones."""
    s = world.dp_shard
    per_param = 0
    for _, dims in shape.parameters():
        boxes = [shard_box(dims[0], s, i) for i in range(s)]
        per_param += sum(1 for _, rows in boxes if rows) + any(rows == 0 for _, rows in boxes)
    return 3 * per_param + len(shape.parameters())  # weights, two Adam moments, a step each


def disk_needed(shape: LlamaShape, world: World, shards: bool = True) -> int:
    return chunk_count(shape, world) * DISK_PER_CHUNK if shards else 0
