"""Load a DCP ``.metadata`` file without torch and without running anything it names.

``.metadata`` is a pickle of ``torch.distributed.checkpoint.metadata.Metadata``. We unpickle
it with :mod:`ckpt_tools.dcp.safe_pickle`, mapping each class torch writes to a bare stand-in
(a :class:`~ckpt_tools.dcp.safe_pickle.Record` declaring the fields torch's class has: a
state with any other field is refused), then convert those into the typed, validated
dataclasses below. Every field is type-checked during the conversion, so a file that
unpickles into nonsense (a string where a size belongs, a negative offset) is a
:class:`CorruptCheckpoint`, not a crash further down.

The conversion is bounded by the file's size (:class:`_Budget`): shared references are
counted every time they are reached, names are at most ``MAX_NAME`` characters, and no
message formats checkpoint data with ``repr`` (``ckpt_tools.errors.shown``), so every later
reader of the result - index, validation, conversion, their messages - works in proportion
to the file too.

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

from ckpt_tools.dcp.files import is_inside
from ckpt_tools.dcp.safe_pickle import Record, restricted_loads
from ckpt_tools.errors import CheckpointError, CorruptCheckpoint, UnsafeCheckpoint, shown
from ckpt_tools.format.layout import DCP_RANK_METADATA_RE
from ckpt_tools.io.safe_read import read_bytes
from ckpt_tools.st import dtypes

# A .metadata file holds a few hundred bytes per chunk: 512 MiB is millions of chunks, far
# beyond any real model, and caps what a pickle bomb can make us allocate.
MAX_METADATA_BYTES = 512 * 2**20
MAX_NDIM = 64
MAX_DIM = 2**62
MAX_OFFSET = 2**63 - 1  # a byte offset or length in a shard file
MAX_NAME = 4096  # characters in a name: a tensor's fqn, a shard file, a path (PATH_MAX)
# The conversion's budget per byte of .metadata (see _Budget): values visited, characters named.
VALUES_PER_BYTE = 1  # real files: under 0.1 (5000 tensors, 40 000 chunks: 0.08)
CHARS_PER_BYTE = 16  # real files: under 1 (0.5 with long names)
BUDGET_BASE = 1 << 16

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
    rank_local: tuple[str, ...] = ()  # the __<r>.metadata files read (their union), when there is no .metadata


# ----------------------------------------------------------------- pickle stand-ins


class _Metadata(Record):
    FIELDS = ("state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version")


class _TensorStorageMetadata(Record):
    FIELDS = ("properties", "size", "chunks")


class _ChunkStorageMetadata(Record):
    FIELDS = ("offsets", "sizes")


class _BytesStorageMetadata(Record):
    pass


class _TensorProperties(Record):
    # torch's TensorProperties.__getstate__: (dtype, layout, requires_grad, mem_format, pin_memory);
    # releases before it pickled a plain dict of the same fields.
    FIELDS = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory")
    TUPLE_STATE = True


class _StorageMeta(Record):
    FIELDS = ("checkpoint_id", "save_id", "load_id", "modules")


class _MetadataIndex(Record):
    FIELDS = ("fqn", "offset", "index")


class _StorageInfo(Record):
    FIELDS = ("relative_path", "offset", "length", "transform_descriptors")


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
    allowed[("collections", "OrderedDict")] = dict  # pickled as OrderedDict() then SETITEMS
    return allowed


METADATA_ALLOWLIST = _allowlist()


# ----------------------------------------------------------------- loading


def load_metadata(directory: str | os.PathLike[str]) -> DcpMetadata:
    """Read and validate ``DIR/.metadata``, or the union of its rank-local ``__<r>.metadata`` files.

    Raises :class:`CheckpointError` subclasses only.
    """
    path = Path(directory) / ".metadata"
    if not path.exists() and not path.is_symlink():
        ranks = rank_metadata_files(Path(directory))
        if ranks:
            return union_metadata([(str(p), _load_file(p)) for p in ranks])
        raise CheckpointError(f"{path}: missing - the DCP save did not complete (torch writes .metadata last)")
    return _load_file(path)


def rank_metadata_files(directory: Path) -> list[Path]:
    """The ``__<rank>.metadata`` files of a save made with ``use_collectives=False``, by rank."""
    try:
        found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := DCP_RANK_METADATA_RE.match(p.name))]
    except OSError:
        return []
    return [p for _, p in sorted(found)]


def _load_file(path: Path) -> DcpMetadata:
    if path.is_symlink() and not is_inside(path.parent, path):
        raise UnsafeCheckpoint(f"{path}: symlink leads outside the checkpoint directory")
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


def union_metadata(parts: list[tuple[str, DcpMetadata]]) -> DcpMetadata:
    """One checkpoint from the metadata each rank wrote on its own (``use_collectives=False``).

    Every rank lists what it saved: a DDP model in full on each rank, a sharded tensor's own
    chunks only. The union keeps each chunk once (the lowest rank's copy, with its storage
    entry); ranks that disagree on a tensor's dtype or size, or on a chunk's size, are refused.
    """
    items: dict[str, TensorMeta | BytesMeta] = {}
    planner: dict[str, tuple[str | int, ...]] = {}
    storage: dict[StorageKey, StorageInfo] = {}
    for what, part in parts:
        for fqn, item in part.items.items():
            have = items.get(fqn)
            if have is None:
                items[fqn] = item
            elif isinstance(have, TensorMeta) and isinstance(item, TensorMeta):
                items[fqn] = _merged_tensor(fqn, have, item, what)
            elif type(have) is not type(item):
                raise CorruptCheckpoint(f"{what}: {_n(fqn)} is a tensor in one rank's metadata and not in another's")
        for fqn, path in part.planner_data.items():
            planner.setdefault(fqn, path)
        for key, info in part.storage.items():
            storage.setdefault(key, info)
    first = parts[0][1]
    return DcpMetadata(
        items=items,
        planner_data=planner,
        storage=storage,
        checkpoint_id=first.checkpoint_id,
        version=first.version,
        modules=first.modules,
        rank_local=tuple(Path(what).name for what, _ in parts),
    )


def _merged_tensor(fqn: str, have: TensorMeta, item: TensorMeta, what: str) -> TensorMeta:
    if (have.dtype, have.size) != (item.dtype, item.size):
        raise CorruptCheckpoint(
            f"{what}: {_n(fqn)} is {item.dtype}{list(item.size)}, another rank's metadata says"
            f" {have.dtype}{list(have.size)}"
        )
    known = {c.offsets: c for c in have.chunks}
    new = []
    for chunk in item.chunks:
        same = known.get(chunk.offsets)
        if same is None:
            new.append(chunk)
            known[chunk.offsets] = chunk
        elif same.sizes != chunk.sizes:
            raise CorruptCheckpoint(f"{what}: {_n(fqn)} chunk at {list(chunk.offsets)} differs from another rank's")
    return TensorMeta(have.dtype, have.size, have.chunks + tuple(new)) if new else have


def parse_metadata(data: bytes, *, what: str = ".metadata") -> DcpMetadata:
    if len(data) > MAX_METADATA_BYTES:
        raise CorruptCheckpoint(f"{what}: larger than any real DCP metadata")
    raw = restricted_loads(data, METADATA_ALLOWLIST, what=what)
    try:
        return _convert(raw, _Budget(len(data)))
    except _Invalid as e:
        raise CorruptCheckpoint(f"{what}: {e}") from None


class _Invalid(Exception):
    pass


def _expect(cond: bool, message: str) -> None:
    """``message`` must cost nothing to build: constant text, names through :func:`_n`, values through ``shown``."""
    if not cond:
        raise _Invalid(message)


def _n(fqn: str) -> str:
    """A tensor's name as a message shows it (quoted, cut after 200 characters)."""
    return shown(fqn, 200)


class _Budget:
    """What the conversion may still visit, in proportion to the file's size.

    A pickle can share one object from many places for a few bytes each: one list of 4096
    chunks under 3000 names, one 512 KiB string as the shard file of every chunk. Each value
    is counted every time it is reached, as every later reader would reach it, and so is each
    string's length; a tensor's name also once per chunk (each chunk's storage entry, index
    entry and messages carry it). Real files spend tens of bytes per chunk, so they stay far
    inside the budget.
    """

    def __init__(self, size: int) -> None:
        self.values_left = VALUES_PER_BYTE * size + BUDGET_BASE
        self.chars_left = CHARS_PER_BYTE * size + BUDGET_BASE

    def values(self, count: int) -> None:
        self.values_left -= count
        _expect(
            self.values_left >= 0,
            "declares more chunks and values than a file of its size can describe (a shared-reference bomb)",
        )

    def chars(self, count: int) -> None:
        self.chars_left -= count
        _expect(
            self.chars_left >= 0,
            "names more text than a file of its size can hold (one string shared from many places?)",
        )

    def name(self, value: Any, what: str, fqn: str | None = None) -> str:
        """``value`` as a name (a string of at most MAX_NAME characters), counted against the budget.

        ``what`` (after the tensor name ``fqn``, if given) is only formatted for a refusal.
        """
        if type(value) is not str or len(value) > MAX_NAME:
            where = what if fqn is None else f"{_n(fqn)}: {what}"
            if type(value) is not str:
                raise _Invalid(f"{where} is {shown(value)}, not a string")
            raise _Invalid(f"{where} is a string of {len(value)} characters (limit {MAX_NAME})")
        self.chars(len(value))
        return value


def _int(v: Any, fqn: str, field: str) -> int:
    if type(v) is not int or not 0 <= v <= MAX_OFFSET:
        raise _Invalid(f"{_n(fqn)} {field} is {shown(v)}, not a non-negative integer")
    return v


def _shape(v: Any, fqn: str, field: str, budget: _Budget) -> tuple[int, ...]:
    if not isinstance(v, (tuple, list)) or len(v) > MAX_NDIM:
        raise _Invalid(f"{_n(fqn)} {field} is not a size")
    budget.values(1 + len(v))
    for x in v:
        if type(x) is not int or not 0 <= x <= MAX_DIM:
            raise _Invalid(f"{_n(fqn)} {field} holds {shown(x)}, not a non-negative integer")
    return tuple(v)


def _convert(raw: Any, budget: _Budget) -> DcpMetadata:
    _expect(isinstance(raw, _Metadata), "not a DCP Metadata object")
    sdm = getattr(raw, "state_dict_metadata", None)
    _expect(isinstance(sdm, dict), "state_dict_metadata is not a dict")
    budget.values(len(sdm))
    items: dict[str, TensorMeta | BytesMeta] = {}
    for fqn, meta in sdm.items():
        name = budget.name(fqn, "a state_dict_metadata key")
        items[name] = _item(name, meta, budget)

    planner: dict[str, tuple[str | int, ...]] = {}
    raw_planner = getattr(raw, "planner_data", None)
    if isinstance(raw_planner, dict):
        budget.values(len(raw_planner))
        for fqn, path in raw_planner.items():
            entry = _planner_entry(fqn, path, budget)
            if entry is not None:
                planner[entry[0]] = entry[1]

    storage: dict[StorageKey, StorageInfo] = {}
    raw_storage = getattr(raw, "storage_data", None)
    _expect(isinstance(raw_storage, dict), "storage_data is not a dict (not written by torch's FileSystemWriter?)")
    budget.values(len(raw_storage))
    for key, info in raw_storage.items():
        storage_key = _storage_key(key, budget)
        if storage_key in storage:
            raise _Invalid(f"storage_data lists {_n(storage_key[0])} twice at the same offset")
        storage[storage_key] = _storage_info(storage_key[0], info, budget)

    checkpoint_id = None
    modules: tuple[str, ...] = ()
    meta = getattr(raw, "storage_meta", None)
    if isinstance(meta, _StorageMeta):
        checkpoint_id = _optional_name(getattr(meta, "checkpoint_id", None), budget)
        mods = getattr(meta, "modules", None)
        if isinstance(mods, list):
            budget.values(len(mods))
            modules = tuple(m for m in (_optional_name(m, budget) for m in mods) if m is not None)
    return DcpMetadata(
        items=items,
        planner_data=planner,
        storage=storage,
        checkpoint_id=checkpoint_id,
        version=_optional_name(getattr(raw, "version", None), budget),
        modules=modules,
    )


def _optional_name(value: Any, budget: _Budget) -> str | None:
    """An informational string (the checkpoint id, a module, the version): kept when it is one."""
    if type(value) is not str or len(value) > MAX_NAME:
        return None
    budget.chars(len(value))
    return value


def _planner_entry(fqn: Any, path: Any, budget: _Budget) -> tuple[str, tuple[str | int, ...]] | None:
    """One ``planner_data`` entry (a name's path in the nested state dict), or None to skip it."""
    if type(fqn) is not str or len(fqn) > MAX_NAME or not isinstance(path, (tuple, list)):
        return None
    budget.values(1 + len(path))
    budget.chars(len(fqn))
    for part in path:
        if type(part) is str and len(part) <= MAX_NAME:
            budget.chars(len(part))
        elif not (type(part) is int and -MAX_OFFSET <= part <= MAX_OFFSET):
            return None
    return fqn, tuple(path)


def _item(fqn: str, meta: Any, budget: _Budget) -> TensorMeta | BytesMeta:
    if isinstance(meta, _BytesStorageMetadata):
        return BytesMeta()
    if not isinstance(meta, _TensorStorageMetadata):
        raise _Invalid(f"{_n(fqn)}: unknown storage metadata type")
    props = getattr(meta, "properties", None)
    if not isinstance(props, _TensorProperties):
        raise _Invalid(f"{_n(fqn)}: no tensor properties")
    dtype = getattr(props, "dtype", None)
    if not isinstance(dtype, _DTypeRef):
        raise _Invalid(f"{_n(fqn)}: dtype is not a torch dtype")
    layout = getattr(props, "layout", "strided")
    if not (type(layout) is str and layout == "strided"):
        raise _Invalid(f"{_n(fqn)}: layout {shown(layout)} is not supported (only strided tensors)")
    size = _shape(getattr(meta, "size", None), fqn, "size", budget)
    raw_chunks = getattr(meta, "chunks", None)
    if not isinstance(raw_chunks, list):
        raise _Invalid(f"{_n(fqn)}: chunks is not a list")
    budget.values(len(raw_chunks))
    budget.chars(len(fqn) * len(raw_chunks))
    chunks = []
    for chunk in raw_chunks:
        if not isinstance(chunk, _ChunkStorageMetadata):
            raise _Invalid(f"{_n(fqn)}: a chunk is not ChunkStorageMetadata")
        offsets = _shape(getattr(chunk, "offsets", None), fqn, "chunk offsets", budget)
        sizes = _shape(getattr(chunk, "sizes", None), fqn, "chunk sizes", budget)
        chunks.append(ChunkMeta(offsets, sizes))
    return TensorMeta(dtype=dtype.name, size=size, chunks=tuple(chunks))


def _storage_key(key: Any, budget: _Budget) -> StorageKey:
    _expect(isinstance(key, _MetadataIndex), "a storage_data key is not a MetadataIndex")
    fqn = budget.name(getattr(key, "fqn", None), "a MetadataIndex fqn")
    offset = getattr(key, "offset", None)
    return (fqn, None if offset is None else _shape(offset, fqn, "storage offset", budget))


def _storage_info(fqn: str, info: Any, budget: _Budget) -> StorageInfo:
    if not isinstance(info, _StorageInfo):
        raise _Invalid(f"{_n(fqn)}: storage info is not a _StorageInfo")
    rel = budget.name(getattr(info, "relative_path", None), "storage relative_path", fqn)
    if rel == "":
        raise _Invalid(f"{_n(fqn)}: storage relative_path is empty")
    transforms = getattr(info, "transform_descriptors", None) or ()
    if not isinstance(transforms, (list, tuple)):
        raise _Invalid(f"{_n(fqn)}: transform_descriptors is not a list of strings")
    budget.values(len(transforms))
    for t in transforms:
        budget.name(t, "a transform descriptor", fqn)
    return StorageInfo(
        relative_path=rel,
        offset=_int(getattr(info, "offset", None), fqn, "storage offset"),
        length=_int(getattr(info, "length", None), fqn, "storage length"),
        transform_descriptors=tuple(transforms),
    )
