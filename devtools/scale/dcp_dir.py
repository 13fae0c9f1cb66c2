"""One DCP directory, generated: plan, shard files and ``.metadata``, one rank at a time.

Ranks are walked in order, as torch's coordinator merges their plans and results; each rank's
shard files are written as soon as their archives are placed, so nothing but the metadata
objects themselves outlives a rank. With ``shards=False`` only ``.metadata`` is written (a
quick look at the metadata alone; the tools will rightly report the files missing).

Python's cyclic garbage collector is paused meanwhile: millions of new container objects (none
in a cycle) would otherwise trigger collections that walk all of them again and again - half
the time of a large generation. What is left is building the objects and ``pickle.dump``,
which alone takes about as long as torch's own writing of the same ``.metadata``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devtools.scale.archives import ArchiveTemplate, Templates
from devtools.scale.files import file_name, split
from devtools.scale.metadata import MetadataBuilder, dump_metadata
from devtools.scale.plan import chunk_box, rank_plans
from devtools.scale.shards import write_sparse
from devtools.scale.state import Item
from devtools.scale.trainer_index import write_trainer_index
from devtools.scale.world import World


@dataclass(frozen=True)
class DcpStats:
    chunks: int  # tensor chunks in .metadata
    items: int  # storage entries (chunks and non-tensor items)
    files: int  # shard files
    file_bytes: int  # their apparent size (holes included)
    metadata_bytes: int
    seconds: float


def write_dcp_dir(
    directory: Path,
    items: list[Item],
    world: World,
    *,
    threads: int,
    templates: Templates,
    checkpoint_id: Path,
    shards: bool = True,
    index: bool = False,
) -> DcpStats:
    """``index``: also write the chunk index the trainer writes beside ``.metadata`` (:mod:`.trainer_index`)."""
    with collector_paused():
        return _write(directory, items, world, threads, templates, checkpoint_id, shards, index)


@contextmanager
def collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _write(
    directory: Path,
    items: list[Item],
    world: World,
    threads: int,
    templates: Templates,
    checkpoint_id: Path,
    shards: bool,
    index: bool,
) -> DcpStats:
    started = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    plans = rank_plans(items, world)
    builder = MetadataBuilder(items, world.size)
    files = file_bytes = 0
    for rank in range(world.size):
        writes, plans[rank] = plans[rank], []
        boxes = {w[0]: chunk_box(items[w[0]], w) for w in writes}  # a rank writes one chunk per item at most
        hints = builder.add_plan(rank, writes, boxes)
        for n, file_writes in enumerate(split(writes, items, threads)):
            archives = [_archive(items[k], boxes[k][1], templates) for k, _, _ in file_writes]
            placed, offset = [], 0
            for (k, _, _), archive in zip(file_writes, archives, strict=True):
                placed.append((k, offset, archive.length))
                offset += archive.length
            name = file_name(rank, n)
            builder.add_file(name, placed, boxes, hints)
            if shards:
                write_sparse(directory / name, archives)
            files += 1
            file_bytes += offset
    metadata = builder.metadata(checkpoint_id)
    size = dump_metadata(metadata, directory)
    if index:
        write_trainer_index(directory, metadata)
    stats = DcpStats(builder.chunks, len(metadata.storage_data), files, file_bytes, size, time.perf_counter() - started)
    del metadata, builder  # the largest objects of a generation: gone before the next directory
    return stats


def _archive(item: Item, sizes: tuple[int, ...], templates: Templates) -> ArchiveTemplate:
    if item.whole is not None:
        return item.whole
    assert item.dtype is not None
    return templates.get(item.dtype, sizes)
