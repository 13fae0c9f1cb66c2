"""Load DCP shards in the training core without letting the checkpoint run code or mislead torch.

torch's ``FileSystemReader.read_metadata`` calls ``pickle.load`` on ``.metadata`` and its
``DefaultLoadPlanner.load_bytes`` calls ``torch.load(weights_only=False)`` on every non-tensor
item: a checkpoint from anywhere could execute whatever it names the moment someone resumes
from it. Here both go through restrictions:

- ``.metadata`` is unpickled with exactly the globals the torch-free reader accepts
  (``ckpt_tools.dcp.metadata.METADATA_ALLOWLIST``: one policy for both halves), resolved to
  the real torch classes so ``dcp.load`` gets the objects it expects; the file is size-capped
  and must be a regular file (a FIFO would block forever);
- non-tensor items (optimizer hyper-parameters) are read with ``torch.load(weights_only=True)``,
  torch's own data-only unpickler;
- before any of that, :func:`require_valid_dcp_inputs` checks each DCP directory the resume
  reads with :mod:`ckpt_tools.dcp.validate`, the check ``inspect`` reports: torch's loader
  would read a storage path that leaves the directory, leave uncovered elements at their
  fresh-init values, and cast a chunk of the wrong dtype, all without an error.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from ckpt_tools.dcp import validate
from ckpt_tools.dcp.metadata import MAX_METADATA_BYTES, METADATA_ALLOWLIST
from ckpt_tools.errors import CorruptCheckpoint, UnsafeCheckpoint
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


def _resolve(module: str, name: str) -> Any:
    """The real object behind an allowlisted global, or None where this torch lacks it."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


class _TorchMetadataUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, what: str) -> None:
        super().__init__(io.BytesIO(data))
        self._what = what

    def find_class(self, module: str, name: str) -> Any:
        found = _resolve(module, name) if (module, name) in METADATA_ALLOWLIST else None
        if found is None:
            raise UnsafeCheckpoint(
                f"{self._what}: refused to load global {module}.{name} (checkpoint pickles may only hold data)"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpoint(f"{self._what}: refused a persistent reference (not expected in .metadata)")


def load_torch_metadata(path: str | os.PathLike[str]) -> Metadata:
    """``.metadata`` as torch's ``Metadata``, built only from allowlisted globals."""
    what = str(path)
    try:
        data = read_bytes(path, MAX_METADATA_BYTES)
    except OSError as e:
        raise CorruptCheckpoint(f"{what}: unreadable ({e.strerror or e})") from None
    try:
        metadata = _TorchMetadataUnpickler(data, what).load()
    except UnsafeCheckpoint:
        raise
    except Exception as e:  # any malformed pickle: truncated, wrong opcodes, wrong arguments
        raise CorruptCheckpoint(f"{what}: not a valid DCP .metadata ({type(e).__name__}: {e})"[:400]) from None
    if not isinstance(metadata, Metadata):
        raise CorruptCheckpoint(f"{what}: not a DCP .metadata (holds a {type(metadata).__name__})")
    return metadata


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
