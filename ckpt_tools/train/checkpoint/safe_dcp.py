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
  torch's own data-only unpickler; tensor chunks are read straight into the tensors they load
  (:class:`DirectFileSystemReader`) after their header went through the torch-free reader, or
  else by torch with ``weights_only=True`` as well;
- before any of that, :func:`require_valid_dcp_inputs` checks each DCP directory the resume
  reads with :mod:`ckpt_tools.dcp.validate`, the check ``inspect`` reports: torch's loader
  would read a storage path that leaves the directory, leave uncovered elements at their
  fresh-init values, and cast a chunk of the wrong dtype, all without an error.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
from typing import Any

import numpy as np
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
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from ckpt_tools.dcp import read_chunk_layout, validate
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.dcp.table import ChunkTable
from ckpt_tools.errors import CorruptCheckpoint, UnsafeCheckpoint, shown
from ckpt_tools.format import layout, manifest
from ckpt_tools.format.layout import StepPaths


def require_valid_dcp_inputs(paths: StepPaths, only: tuple[manifest.Part, ...] | None = None) -> None:
    """Refuse a resume whose DCP directories are not what their ``.metadata`` says.

    Called before any state is touched, on every rank (each reaches the same verdict from the
    same files): the model directory and the optimizer directory, each where the manifest says
    the loader reads it (``only``: those of these parts, for a load of some parts). The first
    problem is raised as the line ``inspect`` shows.
    """
    for part in manifest.dcp_inputs(paths):
        if only is not None and part not in only:
            continue
        validate.require_valid_dir(paths.root / part.path)


def load_torch_metadata(path: str | os.PathLike[str]) -> Metadata:
    """One ``.metadata`` (or rank-local ``__<r>.metadata``) file as torch's ``Metadata``, from what the
    torch-free reader checked."""
    from pathlib import Path

    from ckpt_tools.dcp.metadata import parse_metadata_file

    return to_torch_metadata(parse_metadata_file(Path(path)), str(path))


def directory_torch_metadata(directory: str | os.PathLike[str], state: dict[str, Any] | None = None) -> Metadata:
    """A DCP directory's metadata as torch's ``Metadata``, from its chunk table (the save's index
    when it has a sound one, else ``.metadata`` through the torch-free reader).

    Given the ``state`` this rank loads, only the chunks its local tensors overlap are built:
    torch's planner pairs each local box with every saved chunk and reads those that overlap,
    so the others change nothing - and a 70B model saved by 1024 ranks has 2.2 million of them,
    tens of seconds of object building on every rank for the few thousand one rank reads.
    """
    index = ChunkIndex.load(directory)
    keep = _rows_read_by(index.table, state) if state is not None else None
    return to_torch_metadata(index.table, str(index.root / layout.DCP_METADATA), keep)


def _rows_read_by(table: ChunkTable, state: dict[str, Any]) -> np.ndarray | None:
    """Rows whose chunk overlaps a local box of ``state`` (DCP's test); None: keep every row."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.planner_helpers import _create_chunk_list

    try:
        flat, _ = flatten_state_dict(state)
        keep = np.zeros(table.rows, dtype=bool)
        for fqn, value in flat.items():
            t = table.tensor_id(fqn)
            if t is None or not isinstance(value, torch.Tensor):
                continue
            rows = table.rows_of(t)
            nd = len(table.shapes[t])
            if nd == 0:
                keep[rows] = True
                continue
            offsets, sizes = table.offsets[rows, :nd], table.sizes[rows, :nd]
            for box in _create_chunk_list(value):
                lo = np.asarray(box.offsets, dtype=np.int64)
                hi = lo + np.asarray(box.sizes, dtype=np.int64)
                keep[rows] |= np.all((lo < offsets + sizes) & (offsets < hi), axis=1)
        return keep
    except Exception:  # a state torch's planner would refuse itself: build everything, let it say why
        return None


def to_torch_metadata(table: ChunkTable, what: str, keep: np.ndarray | None = None) -> Metadata:
    """torch's ``Metadata`` for ``table``: the fields torch's load reads, from plain checked values.

    ``TensorProperties`` keeps only the dtype (the only field a load reads; torch marks the
    others deprecated and the reader accepts only strided tensors); a ``MetadataIndex``'s
    ``index`` is a search hint that equality ignores. Chunks without a storage entry are left
    out (validation refuses a directory with one before any load), and so are rows ``keep``
    marks False.
    """
    items: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    storage: dict[MetadataIndex, _StorageInfo] = {}
    files = table.files
    for t, fqn in enumerate(table.names):
        dtype = getattr(torch, table.dtypes[t], None)
        if not isinstance(dtype, torch.dtype):
            raise CorruptCheckpoint(f"{what}: {shown(fqn, 200)} has dtype {table.dtypes[t]}, which this torch lacks")
        rows = table.rows_of(t)
        chunks = []
        for i in range(rows.start, rows.stop):
            f = int(table.file[i])
            if f < 0 or (keep is not None and not keep[i]):
                continue
            nd = max(int(table.ndim[i]), 0)
            offsets = torch.Size(table.offsets[i, :nd].tolist())
            chunks.append(ChunkStorageMetadata(offsets, torch.Size(table.sizes[i, :nd].tolist())))
            transforms = table.transforms[int(table.transform[i])]
            storage[MetadataIndex(fqn, offsets)] = _StorageInfo(
                files[f], int(table.start[i]), int(table.length[i]), list(transforms) or None
            )
        items[fqn] = TensorStorageMetadata(
            properties=TensorProperties(dtype=dtype), size=torch.Size(table.shapes[t]), chunks=chunks
        )
    for item in table.byte_items:
        items[item.name] = BytesStorageMetadata()
        if item.file is not None:
            storage[MetadataIndex(item.name)] = _StorageInfo(
                item.file, item.start, item.length, list(item.transforms) or None
            )
    return Metadata(
        state_dict_metadata=items,
        planner_data={
            **{n: table.paths[t] for t, n in enumerate(table.names)},
            **{b.name: b.path for b in table.byte_items},
        },
        storage_data=storage,
        storage_meta=StorageMeta(checkpoint_id=table.checkpoint_id, modules=list(table.modules)),
        version=table.version,
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
        storage_meta = getattr(metadata, "storage_meta", None)
        if storage_meta is None:
            storage_meta = metadata.storage_meta = StorageMeta()
        storage_meta.load_id = self.load_id
        return metadata


class DirectFileSystemReader(SafeFileSystemReader):
    """The safe reader that reads a tensor chunk's bytes straight into the tensor being loaded.

    torch's ``read_data`` gives every chunk to ``torch.load`` (a fresh tensor, parsed from the
    chunk's zip archive), then copies that tensor into the destination: two passes over every
    byte and a zip parse per chunk. Where nothing has to be converted - no storage transform,
    a contiguous little-endian chunk of the destination's dtype that fills a contiguous CPU
    destination whole (an FSDP shard loaded on the layout that saved it) - this reader finds the
    chunk's bytes with the torch-free archive reader (:func:`ckpt_tools.dcp.read_chunk_layout`,
    data-only unpickling of the chunk header, the one :mod:`ckpt_tools.dcp.validate` checked)
    and reads them into the destination's memory: the same bytes torch would copy there. Every
    other item (a resharded slice, a cast, bytes items) goes through torch's path, unchanged.
    """

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        left: list[ReadItem] = []
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for relative_path, items in per_file.items():
            with self.fs.create_stream(self.fs.concat_path(self.path, relative_path), "rb") as stream:
                fd = stream.fileno() if hasattr(stream, "fileno") else None
                for item in items:
                    if fd is None or not self._read_into(fd, stream, item, planner):
                        left.append(item)
        if left:
            return super().read_data(dataclasses.replace(plan, items=left), planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_into(self, fd: int, stream: Any, item: ReadItem, planner: LoadPlanner) -> bool:
        """Read ``item`` straight into its destination; False (nothing read) when it needs torch's path."""
        info = self.storage_data[item.storage_index]
        if item.type != LoadItemType.TENSOR or info.transform_descriptors or any(item.storage_offsets):
            return False
        chunk = read_chunk_layout(fd, info.offset, info.length, what=f"{self.path}/{info.relative_path}")
        target = planner.resolve_tensor(item).detach()
        if (
            chunk.byteorder != sys.byteorder
            or not chunk.contiguous
            or tuple(item.lengths) != chunk.size
            or tuple(target.shape) != chunk.size
            or chunk.dtype.name != str(target.dtype).removeprefix("torch.")
            or target.device.type != "cpu"
            or not target.is_contiguous()
        ):
            return False
        self._slice_file(stream, info)  # what the reader was asked for (the resume audit counts it)
        _pread_into(fd, target.reshape(-1).view(torch.uint8).numpy(), chunk.data_offset)
        planner.commit_tensor(item, target)
        return True


def _pread_into(fd: int, buffer: Any, offset: int) -> None:
    view = memoryview(buffer).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise CorruptCheckpoint(f"short read at offset {offset + done}: the shard file ends early")
        done += n


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
