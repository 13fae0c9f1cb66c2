"""Which rank writes which chunk: torch's save planning, replayed without the ranks.

Every rank plans one write per item of its state dict, in the dict's order: its own box of each
DTensor, and each whole item (every rank holds those). The coordinator then de-duplicates
(``_dedup_save_plans.dedup_save_plans``): each write that several plans hold - a whole item,
an HSDP shard all replicas hold, the one empty box every empty FSDP shard shares - goes to the
holder whose plan is smallest so far, weighed by the *whole* tensor's bytes (or 1 for a
non-tensor), visiting writes in the order they first appear in the plans 0, 1, ... and breaking
ties in the iteration order of the holders' ``set``. The same sets are built here, so the
choice is torch's. Only replica 0's ranks can see a write first, so only they are walked.
"""

from __future__ import annotations

from devtools.scale.state import Item
from devtools.scale.world import World, shard_box

# (item index, first row, rows): a box along dim 0 of a sharded item; a whole item is (k, 0, 0)
Write = tuple[int, int, int]
Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes) of a chunk in its tensor


def rank_plans(items: list[Item], world: World) -> list[list[Write]]:
    """Per rank, the writes left in its plan after de-duplication, in plan order."""
    r_count, s_count, ranks = world.dp_replicate, world.dp_shard, world.size
    sizes = [0] * ranks
    plans: list[list[Write]] = [[] for _ in range(ranks)]
    boxes = [[shard_box(it.shape[0], s_count, s) for s in range(s_count)] if it.sharded else None for it in items]
    empty_holders = [_empty_holders(b, world) if b is not None else [] for b in boxes]
    everyone = list(range(ranks))
    for p in range(s_count):
        for k, item in enumerate(items):
            box = boxes[k]
            if box is None:
                if p:
                    continue
                write, holders = (k, 0, 0), everyone
            else:
                start, rows = box[p]
                if rows:
                    holders = [r * s_count + p for r in range(r_count)]
                elif empty_holders[k][0] == p:  # the first empty shard: replica 0's rank p
                    holders = empty_holders[k]
                else:
                    continue
                write = (k, start, rows)
            chosen = holders[0] if len(holders) == 1 else min(set(holders), key=sizes.__getitem__)
            sizes[chosen] += item.storage_size
            plans[chosen].append(write)
    for plan in plans:
        plan.sort()  # a rank's plan lists its items in state-dict order
    return plans


def _empty_holders(boxes: list[tuple[int, int]], world: World) -> list[int]:
    """Every rank whose shard of the item is empty, ascending (the order torch adds them to the set)."""
    empty = [s for s, (_, rows) in enumerate(boxes) if rows == 0]
    return [r * world.dp_shard + s for r in range(world.dp_replicate) for s in empty]


def chunk_box(item: Item, write: Write) -> Box:
    """(offsets, sizes) of a write's box in its tensor."""
    shape = item.shape
    if not item.sharded:
        return (0,) * len(shape), shape
    return (write[1], *_ZEROS[len(shape) - 1]), (write[2], *shape[1:])


_ZEROS = [(0,) * n for n in range(8)]
