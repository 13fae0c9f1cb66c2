"""A whole ``torch.save`` file (``.pt``) read torch-free, through the restricted unpickler.

``torch.load`` - even with ``weights_only=True`` - is torch's own unpickler, run on bytes a
checkpoint brought; the tools never import torch, and the trainer should not trust a file more
than the tools do. So a ``.pt`` is read here as a DCP chunk is (:mod:`ckpt_tools.dcp.reader`):
the zip directory, ``data.pkl`` through :func:`~ckpt_tools.dcp.safe_pickle.restricted_loads`
with only torch's tensor-rebuild functions, storage classes and dtypes allowed, and every
tensor checked against the storage bytes the archive holds. The object comes back as plain
Python data with a :class:`~ckpt_tools.dcp.reader.ChunkLayout` in place of each tensor (where
its bytes are in the file); :func:`read_contiguous` hands a tensor's bytes to whoever needs them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ckpt_tools.dcp.reader import TENSOR_ALLOWLIST, ChunkLayout, TensorRecord, storage_reference, tensor_layout
from ckpt_tools.dcp.safe_pickle import restricted_loads
from ckpt_tools.dcp.zipblob import SpanReader, ZipDirectory, read_directory
from ckpt_tools.errors import CheckpointError, CorruptCheckpoint

MAX_PICKLE_BYTES = 16 * 2**20  # the pickle of a state dict: ~150 bytes a tensor, plus its keys


def read_torch_file(path: Path) -> Any:
    """The object ``path`` (a ``torch.save`` file) holds, each tensor a :class:`ChunkLayout`; nothing of it runs.

    Raises :class:`~ckpt_tools.errors.CheckpointError` (missing, unreadable) or
    :class:`~ckpt_tools.errors.CorruptCheckpoint` / ``UnsafeCheckpoint`` (not a plain torch.save of
    tensors and data), one line each.
    """
    what = str(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable ({e.strerror or e})") from None
    try:
        size = os.fstat(fd).st_size
        span = SpanReader(fd, 0, size, what)
        members = read_directory(span)
        pkl = members.member("data.pkl")
        if pkl is None:
            raise CorruptCheckpoint(f"{what}: not a torch.save archive (no data.pkl)")
        if pkl.size > MAX_PICKLE_BYTES:
            raise CorruptCheckpoint(f"{what}: data.pkl of {pkl.size} bytes is too large to decode")
        obj = restricted_loads(
            span.read(pkl.offset, pkl.size), TENSOR_ALLOWLIST, what=what, persistent_load=storage_reference
        )
        return _placed(obj, members, what)
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable ({e.strerror or e})") from None
    finally:
        os.close(fd)


def _placed(obj: Any, members: ZipDirectory, what: str) -> Any:
    """``obj`` with every tensor record replaced by where its bytes are (lists, tuples and dicts walked)."""
    if isinstance(obj, TensorRecord):
        return tensor_layout(obj, members, 0, what=what)
    if isinstance(obj, dict):
        return {k: _placed(v, members, what) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_placed(v, members, what) for v in obj)
    return obj


def read_contiguous(path: Path, layout: ChunkLayout) -> bytes:
    """The bytes of one tensor of ``path``, row-major little-endian (what ``torch.save`` writes of a plain tensor).

    A strided view or a big-endian file is refused in one line: ``torch.save`` of a cloned
    parameter writes neither.
    """
    if not layout.contiguous or layout.byteorder != "little":
        raise CorruptCheckpoint(
            f"{path}: a {list(layout.size)} tensor stored as a strided view or big-endian: not a saved parameter"
        )
    with path.open("rb") as f:
        f.seek(layout.data_offset)
        data = f.read(layout.nbytes)
    if len(data) != layout.nbytes:
        raise CorruptCheckpoint(f"{path}: truncated (a tensor's bytes run past the end of the file)")
    return data
