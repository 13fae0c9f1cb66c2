"""Load DCP shards in the training core without letting the checkpoint run code or mislead torch.

torch's ``FileSystemReader.read_metadata`` calls ``pickle.load`` on ``.metadata`` and its
``DefaultLoadPlanner.load_bytes`` calls ``torch.load(weights_only=False)`` on every non-tensor
item: a checkpoint from anywhere could execute whatever it names the moment someone resumes
from it. Here both go through restrictions:

- ``.metadata`` is read by the torch-free reader (:mod:`ckpt_tools.dcp.metadata`: its
  restricted, bounded unpickler and typed conversion - one policy for both halves), and the
  torch ``Metadata`` that ``dcp.load`` expects is then built here from those checked plain
  values. The pickle never reaches a torch class, a ``pathlib`` class or anything else that
  outlives the load (a ``BUILD`` on a real class would rewrite it for the whole process), and
  torch loads exactly what the validation judged; the file is size-capped and must be a
  regular file (a FIFO would block forever);
- non-tensor items (optimizer hyper-parameters) are read with ``torch.load(weights_only=True)``,
  torch's own data-only unpickler;
- before any of that, :func:`require_valid_dcp_inputs` checks each DCP directory the resume
  reads with :mod:`ckpt_tools.dcp.validate`, the check ``inspect`` reports: torch's loader
  would read a storage path that leaves the directory, leave uncovered elements at their
  fresh-init values, and cast a chunk of the wrong dtype, all without an error.
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
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
from torch.distributed.checkpoint.planner import ReadItem

from ckpt_tools.dcp import validate
from ckpt_tools.dcp.metadata import MAX_METADATA_BYTES, BytesMeta, DcpMetadata, parse_metadata
from ckpt_tools.errors import CorruptCheckpoint, UnsafeCheckpoint, shown
from ckpt_tools.format import manifest
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.io.safe_read import read_bytes


def require_valid_dcp_inputs(paths: StepPaths) -> None:
    """Refuse a resume whose DCP directories are not what their ``.metadata`` says.

    Called before any state is touched, on every rank (each reaches the same verdict from the
    same files): the model directory and the optimizer directory, each where the manifest says
    the loader reads it. The first problem is raised as the line ``inspect`` shows.
    """
    for part in manifest.dcp_inputs(paths):
        validate.require_valid_dir(paths.root / part.path)


def load_torch_metadata(path: str | os.PathLike[str]) -> Metadata:
    """``.metadata`` as torch's ``Metadata``, built from what the torch-free reader checked."""
    what = str(path)
    try:
        data = read_bytes(path, MAX_METADATA_BYTES)
    except OSError as e:
        raise CorruptCheckpoint(f"{what}: unreadable ({e.strerror or e})") from None
    return to_torch_metadata(parse_metadata(data, what=what), what)


def to_torch_metadata(md: DcpMetadata, what: str) -> Metadata:
    """torch's ``Metadata`` for ``md``: the fields torch's load reads, from plain checked values.

    ``TensorProperties`` keeps only the dtype (the only field a load reads; torch marks the
    others deprecated and the reader accepts only strided tensors); a ``MetadataIndex``'s
    ``index`` is a search hint that equality ignores.
    """
    items: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    for fqn, item in md.items.items():
        if isinstance(item, BytesMeta):
            items[fqn] = BytesStorageMetadata()
            continue
        dtype = getattr(torch, item.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise CorruptCheckpoint(f"{what}: {shown(fqn, 200)} has dtype {item.dtype}, which this torch lacks")
        items[fqn] = TensorStorageMetadata(
            properties=TensorProperties(dtype=dtype),
            size=torch.Size(item.size),
            chunks=[ChunkStorageMetadata(torch.Size(c.offsets), torch.Size(c.sizes)) for c in item.chunks],
        )
    storage = {
        MetadataIndex(fqn, offsets): _StorageInfo(
            info.relative_path, info.offset, info.length, list(info.transform_descriptors) or None
        )
        for (fqn, offsets), info in md.storage.items()
    }
    return Metadata(
        state_dict_metadata=items,
        planner_data=dict(md.planner_data),
        storage_data=storage,
        storage_meta=StorageMeta(checkpoint_id=md.checkpoint_id, modules=list(md.modules)),
        version=md.version,
    )


class SafeFileSystemReader(FileSystemReader):
    """torch's file-system reader with the restricted ``.metadata`` load above.

    Give it the metadata already loaded (``load_torch_metadata``) so that a refused file is
    reported before ``dcp.load`` starts: torch catches a failing ``read_metadata``, logs a
    traceback and falls back to per-rank metadata files, burying the reason.
    """

    def __init__(self, path: str | os.PathLike[str], metadata: Metadata | None = None) -> None:
        super().__init__(path)
        self._preloaded = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        if self._preloaded is not None and rank is None:
            metadata = self._preloaded
        else:
            metadata = load_torch_metadata(self._get_metadata_path(rank))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """torch's default load planner, but non-tensor items are unpickled data-only.

    Same placement as ``DefaultLoadPlanner.load_bytes`` (into the nested original state dict
    when it was flattened), only the unpickler differs.
    """

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as e:  # UnpicklingError for a refused global; anything for damaged bytes
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UnsafeCheckpoint(
                f"item {fqn}: refused to unpickle ({first[:200]}); only data may be loaded"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded
