"""``.metadata`` built from torch's own classes and pickled the way ``FileSystemWriter.finish`` does.

The objects are torch's (``Metadata``, ``TensorStorageMetadata``, ``TensorProperties``,
``ChunkStorageMetadata``, ``MetadataIndex``, ``BytesStorageMetadata``, ``StorageMeta``,
``_StorageInfo``), filled in the order torch fills them: ``state_dict_metadata`` and each
tensor's chunk list by rank, then plan order (``create_default_global_save_plan``, which also
sets each index's hint to the chunk's position); ``planner_data`` merged from the ranks' plans
(``dict(ChainMap(...))``: keys in the flattening order); ``storage_data`` from each rank's
write results, file by file; ``version`` and ``storage_meta`` as ``finish`` sets them. The
file is ``pickle.dump`` at the default protocol, written as ``.metadata.tmp`` and renamed.

Even the file's size matches torch's, because the objects are shared as torch shares them and
pickle writes a shared object once: on the coordinator every plan and every rank's results
was unpickled separately, so a name is one object only inside one rank's message - the keys
of ``planner_data`` are the last rank's flattened keys, which ``state_dict_metadata`` shares
for the items that rank wrote first; its values are rank 0's paths (one ``"model"`` string
for all); each storage entry's name is a fresh string; all entries of one shard file share
their ``relative_path`` string.
"""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from devtools.scale.identity import fresh
from devtools.scale.plan import Box, Write
from devtools.scale.state import Item

METADATA_FILE = ".metadata"


class MetadataBuilder:
    """Collects one DCP directory's metadata, rank by rank, as torch's coordinator does."""

    def __init__(self, items: list[Item], ranks: int) -> None:
        self.items = items
        self.last_rank = ranks - 1
        self.planner_keys = [fresh(item.fqn) for item in items]  # the last rank's flattened keys
        self.state_dict_metadata: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
        self.storage_data: dict[MetadataIndex, _StorageInfo] = {}
        self.chunks = 0

    def add_plan(self, rank: int, writes: Sequence[Write], boxes: dict[int, Box]) -> dict[int, int]:
        """The rank's final plan, in plan order, and each item's box on this rank; returns each tensor
        item's chunk position (the index hint)."""
        md = self.state_dict_metadata
        hints = {}
        for write in writes:
            k = write[0]
            item = self.items[k]
            entry = md.get(item.fqn)
            if entry is None:
                key = self.planner_keys[k] if rank == self.last_rank else fresh(item.fqn)
                if item.dtype is None:
                    md[key] = BytesStorageMetadata()
                    continue
                entry = md[key] = TensorStorageMetadata(TensorProperties(dtype=item.dtype), torch.Size(item.shape), [])
            assert isinstance(entry, TensorStorageMetadata)
            offsets, sizes = boxes[k]
            hints[k] = len(entry.chunks)
            entry.chunks.append(ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes)))
            self.chunks += 1
        return hints

    def add_file(
        self, name: str, placed: Sequence[tuple[int, int, int]], boxes: dict[int, Box], hints: dict[int, int]
    ) -> None:
        """One shard file's write results: (item index, offset, length) in file order."""
        relative_path = fresh(name)  # one object for every entry of the file
        storage, items = self.storage_data, self.items
        for k, offset, length in placed:
            item = items[k]
            if item.dtype is None:
                index = MetadataIndex(fresh(item.fqn))
            else:
                index = MetadataIndex(fresh(item.fqn), boxes[k][0], hints[k])
            storage[index] = _StorageInfo(relative_path, offset, length)

    def metadata(self, checkpoint_id: Path) -> Metadata:
        """The finished ``Metadata``; ``checkpoint_id`` is the directory the save wrote into."""
        planner_data = {key: item.path for key, item in zip(self.planner_keys, self.items, strict=True)}
        return Metadata(
            state_dict_metadata=self.state_dict_metadata,
            planner_data=planner_data,
            storage_data=self.storage_data,
            storage_meta=StorageMeta(checkpoint_id=checkpoint_id, save_id=str(uuid.uuid4())),
            version=CURRENT_DCP_VERSION,
        )


def dump_metadata(metadata: Metadata, directory: Path) -> int:
    """Write ``directory/.metadata`` as ``FileSystemWriter.finish`` does; returns its size."""
    tmp = directory / f"{METADATA_FILE}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(metadata, f)
        size = f.tell()
    os.replace(tmp, directory / METADATA_FILE)
    return size
