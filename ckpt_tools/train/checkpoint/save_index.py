"""Index every DCP directory a save writes: the chunk table beside ``.metadata``, for the tools and the resume.

``dcp.save`` returns the ``Metadata`` it pickled into ``.metadata``. The coordinator turns it
into the columnar chunk table with the same conversion the tools apply to a parsed file
(:func:`ckpt_tools.dcp.metadata.table_of`, reading torch's classes instead of the pickle
stand-ins), and writes it as ``.metadata.index`` (:mod:`ckpt_tools.dcp.index_file`), bound to
the ``.metadata`` bytes by size and SHA-256 and stamped with each shard file's size and
modification time: while those are unchanged, the tools know the chunk archives are the ones
this save wrote and need not re-read them. A stale or edited index is refused by the readers
(:mod:`ckpt_tools.dcp.sources`), so the worst an index can do is not be used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from ckpt_tools.dcp import index_file
from ckpt_tools.dcp.metadata import Kinds, table_of
from ckpt_tools.dcp.sources import current_stamps
from ckpt_tools.format import layout


def _dtype_name(dtype: Any) -> str | None:
    return str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else None


TORCH_KINDS = Kinds(
    metadata=Metadata,
    tensor=TensorStorageMetadata,
    bytes_item=BytesStorageMetadata,
    chunk=ChunkStorageMetadata,
    properties=TensorProperties,
    index=MetadataIndex,
    storage=_StorageInfo,
    storage_meta=StorageMeta,
    dtype_name=_dtype_name,
    strided=lambda layout_: layout_ is None or layout_ == torch.strided,
    records=False,
)


def write_save_index(directory: Path, metadata: Metadata) -> None:
    """Coordinator, after ``dcp.save`` into ``directory`` returned ``metadata``: write its index."""
    path = directory / layout.DCP_METADATA
    size = path.stat().st_size
    table = table_of(metadata, TORCH_KINDS, size=size, what=str(path))
    binding = index_file.Binding(
        metadata_size=size,
        metadata_sha256=index_file.file_digest(path),
        stamps=current_stamps(directory, table.files),
    )
    index_file.write_index(directory / layout.DCP_INDEX, table, binding)
