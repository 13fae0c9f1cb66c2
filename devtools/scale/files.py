"""How one rank's writes are spread over its shard files, and where each archive lands.

torch's ``FileSystemWriter`` with ``thread_count=T`` cuts a rank's plan into T buckets
(``_split_by_size_and_type``): non-tensor items dealt round-robin, tensors sorted by the whole
tensor's bytes, largest first (a stable sort), each into the bucket with the fewest bytes so
far (the first such). Each bucket becomes ``__{rank}_{n}.distcp`` - written even when empty -
holding its non-tensor items first, then its tensors, in bucket order (the CPU loader keeps
that order). With T = 1 the plan is one bucket, unsorted. Archives follow each other with no
padding, so an item's offset is the sum of the archive lengths before it.
"""

from __future__ import annotations

from devtools.scale.plan import Write
from devtools.scale.state import Item

DCP_SUFFIX = ".distcp"


def file_name(rank: int, n: int) -> str:
    return f"__{rank}_{n}{DCP_SUFFIX}"


def split(writes: list[Write], items: list[Item], threads: int) -> list[list[Write]]:
    """The writes of each of the rank's files, in the order they are written."""
    if threads == 1:
        buckets = [writes]
    else:
        buckets = [[] for _ in range(threads)]
        sizes = [0] * threads
        bytes_items = [w for w in writes if items[w[0]].dtype is None]
        tensors = [w for w in writes if items[w[0]].dtype is not None]
        for i, w in enumerate(bytes_items):
            buckets[i % threads].append(w)
        tensors.sort(key=lambda w: items[w[0]].nbytes, reverse=True)
        for w in tensors:
            idx = sizes.index(min(sizes))
            buckets[idx].append(w)
            sizes[idx] += items[w[0]].nbytes
    return [
        [w for w in bucket if items[w[0]].dtype is None] + [w for w in bucket if items[w[0]].dtype is not None]
        for bucket in buckets
    ]
