"""DCP directories as torch writes them, and four ways to make one mislead torch's loader.

:func:`write_dcp` lays out a row-sharded 2-rank save the way ``FileSystemWriter`` does
(``torch.save`` of each chunk into ``__<rank>_0.distcp``, a pickled ``Metadata``), in-process.
The damage helpers work on it and on real trainer-written directories alike.

torch's DCP load takes every one of them without an error: it reads the other run's shard,
leaves the uncovered elements at whatever the model held, casts the int32 chunk, and lets
one chunk overwrite another. Each helper edits ``.metadata`` with torch's own classes (the
pristine file was written by torch in this session, so that load is trusted) and returns the
one line :mod:`ckpt_tools.dcp.validate` must give for it, worked out from the metadata.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from devtools.reliability.fuzz_mutations import load_torch_metadata, save_torch_metadata


def write_dcp(directory: Path, tensors: dict[str, torch.Tensor], objects: dict[str, Any] | None = None) -> Path:
    """A 2-rank row-sharded DCP save of ``tensors`` (0-d ones whole on rank 0), plus pickled ``objects``."""
    directory.mkdir(parents=True)
    items: dict[str, Any] = {}
    storage: dict[MetadataIndex, _StorageInfo] = {}
    files: dict[str, bytearray] = {}

    def append(rank: int, data: bytes) -> _StorageInfo:
        name = f"__{rank}_0.distcp"
        buf = files.setdefault(name, bytearray())
        info = _StorageInfo(name, len(buf), len(data))
        buf.extend(data)
        return info

    for fqn, tensor in tensors.items():
        pieces = torch.tensor_split(tensor, 2) if tensor.dim() else (tensor,)
        chunks, row = [], 0
        for rank, piece in enumerate(pieces):
            offsets = torch.Size([row] + [0] * (tensor.dim() - 1)) if tensor.dim() else torch.Size([])
            storage[MetadataIndex(fqn, offsets)] = append(rank, _saved(piece.clone()))
            chunks.append(ChunkStorageMetadata(offsets, piece.shape))
            row += piece.shape[0] if tensor.dim() else 0
        items[fqn] = TensorStorageMetadata(TensorProperties(dtype=tensor.dtype), tensor.shape, chunks)
    for fqn, obj in (objects or {}).items():
        storage[MetadataIndex(fqn)] = append(0, _saved(obj))
        items[fqn] = BytesStorageMetadata()
    for name, data in files.items():
        (directory / name).write_bytes(bytes(data))
    planner = {fqn: tuple(fqn.split(".", 1)) for fqn in items}
    save_torch_metadata(directory, Metadata(items, planner_data=planner, storage_data=storage))
    return directory


def _saved(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def shard_of_another_run(directory: Path, other_run: Path, shard: str = "__1_0.distcp") -> str:
    """Every storage entry in ``shard`` re-pointed at a copy of it in ``other_run``, outside the checkpoint."""
    other_run.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(directory / shard, other_run / shard)
    rel = os.path.relpath(other_run / shard, directory)
    md = load_torch_metadata(directory)
    for info in md.storage_data.values():
        if info.relative_path == shard:
            info.relative_path = rel
    save_torch_metadata(directory, md)
    return f"{rel!r}: shard path leaves the checkpoint directory"


def drop_last_chunk(directory: Path, fqn: str) -> str:
    """``fqn`` loses its last chunk (and that chunk's storage entry): its rows are never loaded."""
    md = load_torch_metadata(directory)
    meta = md.state_dict_metadata[fqn]
    last = meta.chunks.pop()
    del md.storage_data[MetadataIndex(fqn, last.offsets)]
    save_torch_metadata(directory, md)
    covered = sum(c.sizes.numel() for c in meta.chunks)
    return f"{fqn}: chunks cover {covered} of {meta.size.numel()} elements (missing chunks)"


def int32_chunk(directory: Path, fqn: str) -> str:
    """``fqn``'s first chunk re-pointed at an archive of the same values as int32, appended to its file."""
    md = load_torch_metadata(directory)
    meta = md.state_dict_metadata[fqn]
    chunk = meta.chunks[0]
    info = md.storage_data[MetadataIndex(fqn, chunk.offsets)]
    path = directory / info.relative_path
    with open(path, "rb") as f:
        f.seek(info.offset)
        original = torch.load(io.BytesIO(f.read(info.length)), weights_only=True)
    data = _saved(original.to(torch.int32))
    info.offset, info.length = path.stat().st_size, len(data)
    with open(path, "ab") as f:
        f.write(data)
    save_torch_metadata(directory, md)
    dtype, sizes = str(meta.properties.dtype).removeprefix("torch."), list(chunk.sizes)
    return f"{info.relative_path} ({fqn} chunk at {list(chunk.offsets)}): holds int32{sizes}, .metadata says {dtype}{sizes}"


def overlapping_chunks(directory: Path, fqn: str) -> str:
    """``fqn``'s second chunk moved up one row along dim 0: it overlaps the first."""
    md = load_torch_metadata(directory)
    second = md.state_dict_metadata[fqn].chunks[1]
    info = md.storage_data.pop(MetadataIndex(fqn, second.offsets))
    second.offsets = torch.Size([second.offsets[0] - 1, *second.offsets[1:]])
    md.storage_data[MetadataIndex(fqn, second.offsets)] = info
    save_torch_metadata(directory, md)
    return f"{fqn}: chunks overlap (unsupported sharding layout or corrupt metadata)"
