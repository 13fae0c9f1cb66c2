"""Load a DCP ``.metadata`` file without torch and without running anything it names.

``.metadata`` is a pickle of ``torch.distributed.checkpoint.metadata.Metadata``. We unpickle
it with :mod:`ckpt_tools.dcp.safe_pickle`, mapping each class torch writes to a bare stand-in
that only stores attributes, then convert those into the typed, validated dataclasses below.
Every field is type-checked during the conversion, so a file that unpickles into nonsense
(a string where a size belongs, a negative offset) is a :class:`CorruptCheckpoint`, not a
crash further down.

Which globals appear (checked on files written by torch 2.13 and read from torch's source for
older releases): the metadata dataclasses, ``_StorageInfo`` from ``filesystem``,
``torch.Size``, dtypes, ``torch.serialization._get_layout``, the ``_MEM_FORMAT_ENCODING``
enum, ``pathlib`` paths (the checkpoint id, mapped to ``str``), and ``collections.OrderedDict``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_tools.dcp.safe_pickle import restricted_loads
from ckpt_tools.errors import CheckpointError, CorruptCheckpoint
from ckpt_tools.io.safe_read import read_bytes
from ckpt_tools.st import dtypes

# A .metadata file holds a few hundred bytes per chunk: 512 MiB is millions of chunks, far
# beyond any real model, and caps what a pickle bomb can make us allocate.
MAX_METADATA_BYTES = 512 * 2**20
MAX_NDIM = 64
MAX_DIM = 2**62

# ----------------------------------------------------------------- typed result


@dataclass(frozen=True)
class ChunkMeta:
    """One saved piece of a tensor: the box ``offsets .. offsets+sizes``."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        return dtypes.numel(self.sizes)


@dataclass(frozen=True)
class TensorMeta:
    dtype: str  # canonical torch name, e.g. "float32"
    size: tuple[int, ...]
    chunks: tuple[ChunkMeta, ...]

    @property
    def numel(self) -> int:
        return dtypes.numel(self.size)


@dataclass(frozen=True)
class BytesMeta:
    """A non-tensor item (``BYTE_IO``): an arbitrary pickled object in the shard files."""


@dataclass(frozen=True)
class StorageInfo:
    """Where one item's bytes live: a span of a shard file, relative to the DCP directory."""

    relative_path: str
    offset: int
    length: int
    transform_descriptors: tuple[str, ...] = ()


StorageKey = tuple[str, "tuple[int, ...] | None"]  # (fqn, chunk offsets) - MetadataIndex's identity


@dataclass(frozen=True)
class DcpMetadata:
    items: dict[str, TensorMeta | BytesMeta]
    planner_data: dict[str, tuple[str | int, ...]]
    storage: dict[StorageKey, StorageInfo]
    checkpoint_id: str | None = None
    version: str | None = None
    modules: tuple[str, ...] = field(default_factory=tuple)


# ----------------------------------------------------------------- pickle stand-ins


class _Stand:
    """Accepts whatever state the pickle gives; the typed conversion decides if it makes sense.

    No ``__setstate__``: pickle's BUILD then fills ``__dict__`` in C, which keeps loading the
    metadata of a large model fast. Nothing here is ever called by name from the pickle's
    state, so odd keys are inert; :func:`_convert` reads only the attributes it knows.
    """

    _positional: tuple[str, ...] = ()

    def __init__(self, *args: Any) -> None:
        if len(args) > len(self._positional):
            raise TypeError(f"{type(self).__name__}: too many arguments")
        self.__dict__.update(zip(self._positional, args, strict=False))


class _Metadata(_Stand):
    _positional = ("state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version")


class _TensorStorageMetadata(_Stand):
    _positional = ("properties", "size", "chunks")


class _ChunkStorageMetadata(_Stand):
    _positional = ("offsets", "sizes")


class _BytesStorageMetadata(_Stand):
    pass


class _TensorProperties(_Stand):
    _positional = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory")

    def __setstate__(self, state: Any) -> None:
        # torch's TensorProperties.__getstate__: (dtype, layout, requires_grad, mem_format, pin_memory);
        # releases before it pickled a plain dict.
        if isinstance(state, tuple) and len(state) <= len(self._positional):
            self.__dict__.update(zip(self._positional, state, strict=False))
        elif isinstance(state, dict):
            self.__dict__.update((k, v) for k, v in state.items() if k in self._positional)
        else:
            raise TypeError("TensorProperties: unexpected state")


class _StorageMeta(_Stand):
    _positional = ("checkpoint_id", "save_id", "load_id", "modules")


class _MetadataIndex(_Stand):
    _positional = ("fqn", "offset", "index")


class _StorageInfo(_Stand):
    _positional = ("relative_path", "offset", "length", "transform_descriptors")


@dataclass(frozen=True)
class _DTypeRef:
    name: str


def _get_layout(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError("layout name must be a string")
    return name.removeprefix("torch.")


def _mem_format(value: Any) -> int:
    if not isinstance(value, int):
        raise TypeError("memory format encoding must be an int")
    return value


def _path(*parts: Any) -> str:
    if not all(isinstance(p, str) for p in parts):
        raise TypeError("path parts must be strings")
    return os.path.join(*parts) if parts else ""


def _ordered_dict(items: Any = ()) -> dict[Any, Any]:
    return dict(items)


_DCP_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed._shard.checkpoint.metadata",  # torch 1.13 - 2.0
)
_FS_MODULES = (
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed._shard.checkpoint.filesystem",
)
_PATH_MODULES = ("pathlib", "pathlib._local")  # 3.13 moved the classes to pathlib._local


def _allowlist() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {}
    for module in _DCP_MODULES:
        allowed[(module, "Metadata")] = _Metadata
        allowed[(module, "TensorStorageMetadata")] = _TensorStorageMetadata
        allowed[(module, "ChunkStorageMetadata")] = _ChunkStorageMetadata
        allowed[(module, "BytesStorageMetadata")] = _BytesStorageMetadata
        allowed[(module, "TensorProperties")] = _TensorProperties
        allowed[(module, "StorageMeta")] = _StorageMeta
        allowed[(module, "MetadataIndex")] = _MetadataIndex
        allowed[(module, "_MEM_FORMAT_ENCODING")] = _mem_format
    # torch <= 2.1 pickled TensorProperties (and its memory-format enum) from the ShardedTensor code.
    old = "torch.distributed._shard.sharded_tensor.metadata"
    allowed[(old, "TensorProperties")] = _TensorProperties
    allowed[(old, "MEM_FORMAT_ENCODING")] = _mem_format
    for module in _FS_MODULES:
        allowed[(module, "_StorageInfo")] = _StorageInfo
    for module in _PATH_MODULES:
        for cls in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"):
            allowed[(module, cls)] = _path
    # torch.Size(seq) → tuple(seq); the typed conversion checks it holds small non-negative ints.
    allowed[("torch", "Size")] = tuple
    allowed[("torch.serialization", "_get_layout")] = _get_layout
    for layout in (
        "strided",
        "sparse_coo",
        "sparse_csr",
        "sparse_csc",
        "sparse_bsr",
        "sparse_bsc",
        "_mkldnn",
        "jagged",
    ):
        allowed[("torch", layout)] = layout
    for name in dtypes.TORCH_DTYPE_NAMES:
        allowed[("torch", name)] = _DTypeRef(dtypes.canonical_name(name))
    allowed[("collections", "OrderedDict")] = _ordered_dict
    return allowed


METADATA_ALLOWLIST = _allowlist()


# ----------------------------------------------------------------- loading


def load_metadata(directory: str | os.PathLike[str]) -> DcpMetadata:
    """Read and validate ``DIR/.metadata``. Raises :class:`CheckpointError` subclasses only."""
    path = Path(directory) / ".metadata"
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CheckpointError(
            f"{path}: missing - the DCP save did not complete (torch writes .metadata last)"
        ) from None
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable ({e.strerror})") from None
    if size > MAX_METADATA_BYTES:
        raise CorruptCheckpoint(f"{path}: {size} bytes, larger than any real DCP metadata (limit {MAX_METADATA_BYTES})")
    try:
        data = read_bytes(path, MAX_METADATA_BYTES)  # a FIFO or a device is refused, never read
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable ({e.strerror})") from None
    return parse_metadata(data, what=str(path))


def parse_metadata(data: bytes, *, what: str = ".metadata") -> DcpMetadata:
    if len(data) > MAX_METADATA_BYTES:
        raise CorruptCheckpoint(f"{what}: larger than any real DCP metadata")
    raw = restricted_loads(data, METADATA_ALLOWLIST, what=what)
    try:
        return _convert(raw, budget=[len(data)])
    except _Invalid as e:
        raise CorruptCheckpoint(f"{what}: {e}") from None


class _Invalid(Exception):
    pass


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise _Invalid(message)


def _int(v: Any, what: str) -> int:
    _expect(isinstance(v, int) and not isinstance(v, bool) and v >= 0, f"{what} is not a non-negative integer")
    return int(v)


def _shape(v: Any, what: str) -> tuple[int, ...]:
    _expect(isinstance(v, (tuple, list)) and len(v) <= MAX_NDIM, f"{what} is not a size")
    for x in v:
        _expect(type(x) is int and 0 <= x <= MAX_DIM, f"{what} holds {x!r}, not a non-negative integer")
    return tuple(v)


def _convert(raw: Any, budget: list[int]) -> DcpMetadata:
    """``budget``: how many chunks the file may declare in all - one per byte of it at most.

    A real file spends dozens of bytes on every chunk; a pickle that shares one list of
    thousands of chunks between thousands of names spends a few, and would make every reader
    build millions of chunk records from a file of kilobytes.
    """
    _expect(isinstance(raw, _Metadata), "not a DCP Metadata object")
    sdm = getattr(raw, "state_dict_metadata", None)
    _expect(isinstance(sdm, dict), "state_dict_metadata is not a dict")
    items: dict[str, TensorMeta | BytesMeta] = {}
    for fqn, meta in sdm.items():
        _expect(isinstance(fqn, str), "a state_dict_metadata key is not a string")
        items[fqn] = _item(fqn, meta, budget)

    planner: dict[str, tuple[str | int, ...]] = {}
    raw_planner = getattr(raw, "planner_data", None)
    if isinstance(raw_planner, dict):
        for fqn, path in raw_planner.items():
            if (
                isinstance(fqn, str)
                and isinstance(path, (tuple, list))
                and all(isinstance(p, (str, int)) for p in path)
            ):
                planner[fqn] = tuple(path)

    storage: dict[StorageKey, StorageInfo] = {}
    raw_storage = getattr(raw, "storage_data", None)
    _expect(isinstance(raw_storage, dict), "storage_data is not a dict (not written by torch's FileSystemWriter?)")
    for key, info in raw_storage.items():
        storage_key = _storage_key(key)
        _expect(storage_key not in storage, f"storage_data lists {storage_key[0]!r} twice at the same offset")
        storage[storage_key] = _storage_info(storage_key[0], info)

    checkpoint_id = modules = None
    meta = getattr(raw, "storage_meta", None)
    if isinstance(meta, _StorageMeta):
        cid = getattr(meta, "checkpoint_id", None)
        checkpoint_id = cid if isinstance(cid, str) else None
        mods = getattr(meta, "modules", None)
        modules = tuple(m for m in mods if isinstance(m, str)) if isinstance(mods, list) else None
    version = getattr(raw, "version", None)
    return DcpMetadata(
        items=items,
        planner_data=planner,
        storage=storage,
        checkpoint_id=checkpoint_id,
        version=version if isinstance(version, str) else None,
        modules=modules or (),
    )


def _item(fqn: str, meta: Any, budget: list[int]) -> TensorMeta | BytesMeta:
    if isinstance(meta, _BytesStorageMetadata):
        return BytesMeta()
    _expect(isinstance(meta, _TensorStorageMetadata), f"{fqn!r}: unknown storage metadata type")
    props = getattr(meta, "properties", None)
    _expect(isinstance(props, _TensorProperties), f"{fqn!r}: no tensor properties")
    dtype = getattr(props, "dtype", None)
    _expect(isinstance(dtype, _DTypeRef), f"{fqn!r}: dtype is not a torch dtype")
    layout = getattr(props, "layout", "strided")
    _expect(layout == "strided", f"{fqn!r}: layout {layout!r} is not supported (only strided tensors)")
    size = _shape(getattr(meta, "size", None), f"{fqn!r} size")
    raw_chunks = getattr(meta, "chunks", None)
    _expect(isinstance(raw_chunks, list), f"{fqn!r}: chunks is not a list")
    budget[0] -= len(raw_chunks)
    _expect(budget[0] >= 0, "declares more chunks than a file of its size can describe (shared-reference bomb)")
    chunks = []
    for chunk in raw_chunks:
        _expect(isinstance(chunk, _ChunkStorageMetadata), f"{fqn!r}: a chunk is not ChunkStorageMetadata")
        offsets = _shape(getattr(chunk, "offsets", None), f"{fqn!r} chunk offsets")
        sizes = _shape(getattr(chunk, "sizes", None), f"{fqn!r} chunk sizes")
        chunks.append(ChunkMeta(offsets, sizes))
    return TensorMeta(dtype=dtype.name, size=size, chunks=tuple(chunks))


def _storage_key(key: Any) -> StorageKey:
    _expect(isinstance(key, _MetadataIndex), "a storage_data key is not a MetadataIndex")
    fqn = getattr(key, "fqn", None)
    _expect(isinstance(fqn, str), "a MetadataIndex has no fqn")
    offset = getattr(key, "offset", None)
    return (fqn, None if offset is None else _shape(offset, f"{fqn!r} storage offset"))


def _storage_info(fqn: str, info: Any) -> StorageInfo:
    _expect(isinstance(info, _StorageInfo), f"{fqn!r}: storage info is not a _StorageInfo")
    rel = getattr(info, "relative_path", None)
    _expect(isinstance(rel, str) and rel != "", f"{fqn!r}: storage relative_path is not a string")
    transforms = getattr(info, "transform_descriptors", None) or ()
    _expect(
        isinstance(transforms, (list, tuple)) and all(isinstance(t, str) for t in transforms),
        f"{fqn!r}: transform_descriptors is not a list of strings",
    )
    return StorageInfo(
        relative_path=rel,
        offset=_int(getattr(info, "offset", None), f"{fqn!r} storage offset"),
        length=_int(getattr(info, "length", None), f"{fqn!r} storage length"),
        transform_descriptors=tuple(transforms),
    )
