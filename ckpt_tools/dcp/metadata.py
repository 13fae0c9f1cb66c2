"""Read a DCP ``.metadata`` file without torch and without running anything it names.

``.metadata`` is a pickle of ``torch.distributed.checkpoint.metadata.Metadata``. It is
unpickled with each class torch writes mapped to a bare stand-in (a
:class:`~ckpt_tools.dcp.safe_pickle.Record` declaring the fields torch's class has), then
converted into a :class:`~ckpt_tools.dcp.table.ChunkTable` - columns, not an object per chunk.
Every value is type- and range-checked during the conversion, so a file that unpickles into
nonsense (a string where a size belongs, a negative offset) is a :class:`CorruptCheckpoint`,
not a crash further down.

Two engines unpickle, with one allowlist and one conversion:

- files up to :data:`IN_PROCESS_MAX_BYTES` (and every file where the platform has no
  resource limits): the restricted pure-Python unpickler of
  :mod:`~ckpt_tools.dcp.safe_pickle`, in this process;
- larger files: C's unpickler in a separate, resource-limited process
  (:mod:`~ckpt_tools.dcp.isolated`), several times faster than torch's own read. Nothing the
  file does there can reach this process; CPU time and memory are capped in proportion to the
  file's size, so a pickle bomb ends as a refusal.

The conversion is bounded by the file's size (:class:`_Budget`): shared references are
counted every time they are reached and names are at most ``MAX_NAME`` characters, so every
later reader of the result works in proportion to the file too.

Which globals appear (checked on files written by torch 2.13 and read from torch's source for
older releases): the metadata dataclasses, ``_StorageInfo`` from ``filesystem``,
``torch.Size``, dtypes, ``torch.serialization._get_layout``, the ``_MEM_FORMAT_ENCODING``
enum, ``pathlib`` paths (the checkpoint id, mapped to ``str``), and ``collections.OrderedDict``.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_tools.dcp.files import is_inside
from ckpt_tools.dcp.safe_pickle import Pure, Record, TupleStateRecord, restricted_loads
from ckpt_tools.dcp.table import (
    MAX_DIM,
    MAX_NAME,
    MAX_NDIM,
    MAX_OFFSET,
    ChunkTable,
    TableBuilder,
    TableError,
)
from ckpt_tools.errors import CheckpointError, CorruptCheckpoint, UnsafeCheckpoint, shown
from ckpt_tools.format.layout import DCP_RANK_METADATA_RE
from ckpt_tools.io.remote import RemoteFile, as_path, read_remote_whole, remote_file
from ckpt_tools.io.safe_read import open_regular
from ckpt_tools.st import dtypes

__all__ = [
    "MAX_DIM",
    "MAX_METADATA_BYTES",
    "MAX_NAME",
    "MAX_NDIM",
    "MAX_OFFSET",
    "load_metadata",
    "parse_metadata",
]

# A .metadata file holds about 180 bytes per chunk: 4 GiB is 20 million chunks, a 70B model
# saved by 8192 ranks; the cap keeps a bogus size from being read at all.
MAX_METADATA_BYTES = 4 * 2**30
IN_PROCESS_MAX_BYTES = 1 * 2**20  # above this, C's unpickler in an isolated process
# The conversion's budget per byte of .metadata (see _Budget): values visited, characters named.
VALUES_PER_BYTE = 1  # real files: under 0.1 (5000 tensors, 40 000 chunks: 0.08)
CHARS_PER_BYTE = 16  # real files: under 1 (0.5 with long names)
BUDGET_BASE = 1 << 16
# Which engine reads a file: "auto" (by size), "in-process" or "isolated" (tests and the fuzz
# campaign run both on the same inputs).
ENGINE_ENV = "CKPT_TOOLS_METADATA_ENGINE"


# ----------------------------------------------------------------- pickle stand-ins


class _Metadata(Record):
    FIELDS = ("state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version")


class _TensorStorageMetadata(Record):
    FIELDS = ("properties", "size", "chunks")


class _ChunkStorageMetadata(Record):
    FIELDS = ("offsets", "sizes")


class _BytesStorageMetadata(Record):
    pass


class _TensorProperties(TupleStateRecord):
    # torch's TensorProperties.__getstate__: (dtype, layout, requires_grad, mem_format, pin_memory);
    # releases before it pickled a plain dict of the same fields.
    FIELDS = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory")


class _StorageMeta(Record):
    FIELDS = ("checkpoint_id", "save_id", "load_id", "modules")


class _MetadataIndex(Record):
    FIELDS = ("fqn", "offset", "index")


class _StorageInfo(Record):
    FIELDS = ("relative_path", "offset", "length", "transform_descriptors")


_CHUNK_FIELDS = frozenset(_ChunkStorageMetadata.FIELDS)
_INDEX_FIELDS = frozenset(_MetadataIndex.FIELDS)
_INFO_FIELDS = frozenset(_StorageInfo.FIELDS)


@dataclass(frozen=True, slots=True)
class _DTypeRef:
    """A torch dtype in a pickle: frozen with no ``__dict__``, so no ``BUILD`` can rename it."""

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
    if not all(isinstance(p, str) for p in parts) or sum(len(p) for p in parts) > MAX_NAME:
        raise TypeError("path parts must be strings of a path's length")
    return os.path.join(*parts) if parts else ""


class _TorchSize(Pure):
    """``torch.Size(seq)``: a tuple of at most MAX_NDIM values (the conversion checks they are ints).

    Called three times per chunk, so it is its own :class:`Pure` with the check inline.
    """

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(tuple)

    def __call__(self, values: Any = ()) -> tuple[Any, ...]:  # type: ignore[override]
        if type(values) is tuple and len(values) <= MAX_NDIM:
            return values
        if type(values) is list and len(values) <= MAX_NDIM:
            return tuple(values)
        raise TypeError("torch.Size of something that is not a short tuple")


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
    mem_format, path = Pure(_mem_format), Pure(_path)
    for module in _DCP_MODULES:
        allowed[(module, "Metadata")] = _Metadata
        allowed[(module, "TensorStorageMetadata")] = _TensorStorageMetadata
        allowed[(module, "ChunkStorageMetadata")] = _ChunkStorageMetadata
        allowed[(module, "BytesStorageMetadata")] = _BytesStorageMetadata
        allowed[(module, "TensorProperties")] = _TensorProperties
        allowed[(module, "StorageMeta")] = _StorageMeta
        allowed[(module, "MetadataIndex")] = _MetadataIndex
        allowed[(module, "_MEM_FORMAT_ENCODING")] = mem_format
    # torch <= 2.1 pickled TensorProperties (and its memory-format enum) from the ShardedTensor code.
    old = "torch.distributed._shard.sharded_tensor.metadata"
    allowed[(old, "TensorProperties")] = _TensorProperties
    allowed[(old, "MEM_FORMAT_ENCODING")] = mem_format
    for module in _FS_MODULES:
        allowed[(module, "_StorageInfo")] = _StorageInfo
    for module in _PATH_MODULES:
        for cls in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"):
            allowed[(module, cls)] = path
    # torch.Size(seq) → a tuple; the typed conversion checks it holds small non-negative ints.
    allowed[("torch", "Size")] = _TorchSize()
    allowed[("torch.serialization", "_get_layout")] = Pure(_get_layout)
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


def load_metadata(directory: str | os.PathLike[str]) -> ChunkTable:
    """Read and check ``DIR/.metadata``, or the union of its rank-local ``__<r>.metadata`` files.

    Raises :class:`CheckpointError` subclasses only.
    """
    path = as_path(directory) / ".metadata"
    if not path.exists() and not path.is_symlink():
        ranks = rank_metadata_files(as_path(directory))
        if ranks:
            return union_tables([(str(p), parse_metadata_file(p)) for p in ranks])
        raise CheckpointError(f"{path}: missing - the DCP save did not complete (torch writes .metadata last)")
    return parse_metadata_file(path)


def rank_metadata_files(directory: Path) -> list[Path]:
    """The ``__<rank>.metadata`` files of a save made with ``use_collectives=False``, by rank."""
    try:
        found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := DCP_RANK_METADATA_RE.match(p.name))]
    except OSError:
        return []
    return [p for _, p in sorted(found)]


def parse_metadata_file(path: Path) -> ChunkTable:
    """One ``.metadata`` file, by the engine its size calls for (module docstring)."""
    if path.is_symlink() and not is_inside(path.parent, path):
        raise UnsafeCheckpoint(f"{path}: symlink leads outside the checkpoint directory")
    remote = remote_file(path)
    if remote is not None:  # on the Hub: read whole (it is small), parsed in this process
        return _parse_remote(remote, path)
    try:
        fd = open_regular(path)  # a FIFO or a device is refused, never read
    except FileNotFoundError:
        raise CheckpointError(
            f"{path}: missing - the DCP save did not complete (torch writes .metadata last)"
        ) from None
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable ({e.strerror or e})") from None
    try:
        size = os.fstat(fd).st_size
        if size > MAX_METADATA_BYTES:
            raise CorruptCheckpoint(
                f"{path}: {size} bytes, larger than any real DCP metadata (limit {MAX_METADATA_BYTES})"
            )
        if _isolated(size):
            from ckpt_tools.dcp import isolated

            return isolated.parse(fd, size, what=str(path))
        return parse_metadata(_read_all(fd, size, str(path)), what=str(path))
    finally:
        os.close(fd)


def _parse_remote(remote: RemoteFile, path: Path) -> ChunkTable:
    try:
        data = read_remote_whole(remote, MAX_METADATA_BYTES, str(path))
    except FileNotFoundError:
        raise CheckpointError(
            f"{path}: missing - the DCP save did not complete (torch writes .metadata last)"
        ) from None
    except OSError as e:
        raise CorruptCheckpoint(f"{path}: unreadable ({e.strerror or e})") from None
    return parse_metadata(data, what=str(path))


def _isolated(size: int) -> bool:
    engine = os.environ.get(ENGINE_ENV, "auto")
    if engine == "in-process":
        return False
    from ckpt_tools.dcp import isolated

    if not isolated.available():
        return False
    return engine == "isolated" or size > IN_PROCESS_MAX_BYTES


def _read_all(fd: int, size: int, what: str) -> bytes:
    chunks, got = [], 0
    while got < size:
        data = os.pread(fd, min(1 << 24, size - got), got)
        if not data:
            break
        chunks.append(data)
        got += len(data)
    if got != size:
        raise CorruptCheckpoint(f"{what}: changed while it was read")
    return b"".join(chunks)


def parse_metadata(data: bytes, *, what: str = ".metadata") -> ChunkTable:
    """The table of a ``.metadata`` pickle, read in this process by the restricted unpickler."""
    if len(data) > MAX_METADATA_BYTES:
        raise CorruptCheckpoint(f"{what}: larger than any real DCP metadata")
    with collector_paused():
        raw = restricted_loads(data, METADATA_ALLOWLIST, what=what)
        return table_of(raw, RECORD_KINDS, size=len(data), what=what)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a pickle's objects are made: they hold no cycles, and
    each collection would walk all of them again (a third of the read's time on a large file)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def union_tables(parts: list[tuple[str, ChunkTable]]) -> ChunkTable:
    """One checkpoint from the metadata each rank wrote on its own (``use_collectives=False``).

    Every rank lists what it saved: a DDP model in full on each rank, a sharded tensor's own
    chunks only. The union keeps each chunk once (the lowest rank's copy, with its storage
    entry); ranks that disagree on a tensor's dtype or size, or on a chunk's size, are refused.
    """
    b = TableBuilder()
    seen: dict[str, tuple[str, tuple[int, ...]]] = {}
    chunks: dict[tuple[str, tuple[int, ...]], tuple[int, ...]] = {}
    bytes_seen: set[str] = set()
    for what, part in parts:
        for t, name in enumerate(part.names):
            have = seen.get(name)
            if name in bytes_seen:
                raise CorruptCheckpoint(f"{what}: {_n(name)} is a tensor in one rank's metadata and not in another's")
            if have is None:
                seen[name] = (part.dtypes[t], part.shapes[t])
                b.planner.setdefault(name, part.paths[t])
                tid = b.tensor(name, part.dtypes[t], part.shapes[t])
            elif have != (part.dtypes[t], part.shapes[t]):
                raise CorruptCheckpoint(
                    f"{what}: {_n(name)} is {part.dtypes[t]}{list(part.shapes[t])}, another rank's metadata says"
                    f" {have[0]}{list(have[1])}"
                )
            else:
                tid = b.tensor_ids()[name]
            rows = part.rows_of(t)
            for i in range(rows.start, rows.stop):
                nd = int(part.ndim[i])
                offsets = tuple(part.offsets[i, : max(nd, 0)].tolist())
                sizes = tuple(part.sizes[i, : max(nd, 0)].tolist())
                known = chunks.get((name, offsets))
                if known is not None:
                    if known != sizes:
                        raise CorruptCheckpoint(
                            f"{what}: {_n(name)} chunk at {list(offsets)} differs from another rank's"
                        )
                    continue
                chunks[(name, offsets)] = sizes
                b.chunk(tid, offsets, sizes)
                f = int(part.file[i])
                if f >= 0:
                    transform = b.transform_id(part.transforms[int(part.transform[i])])
                    b.storage(name, offsets, part.files[f], int(part.start[i]), int(part.length[i]), transform)
        for item in part.byte_items:
            if item.name in seen:
                raise CorruptCheckpoint(
                    f"{what}: {_n(item.name)} is a tensor in one rank's metadata and not in another's"
                )
            if item.name not in bytes_seen:
                bytes_seen.add(item.name)
                b.byte_item(item.name)
                b.planner.setdefault(item.name, item.path)
            if item.file is not None:
                b.storage(item.name, None, item.file, item.start, item.length, b.transform_id(item.transforms))
    first = parts[0][1]
    b.checkpoint_id, b.version, b.modules = first.checkpoint_id, first.version, first.modules
    b.save_id = first.save_id
    b.rank_local = tuple(Path(what).name for what, _ in parts)
    try:
        return b.build()
    except TableError as e:
        raise CorruptCheckpoint(f"{parts[0][0]}: {e}") from None


# ----------------------------------------------------------------- the conversion


class _Invalid(Exception):
    pass


def _n(fqn: str) -> str:
    """A tensor's name as a message shows it (quoted, cut after 200 characters)."""
    return shown(fqn, 200)


class _Budget:
    """What the conversion may still visit, in proportion to the file's size.

    A pickle can share one object from many places for a few bytes each: one list of 4096
    chunks under 3000 names, one 512 KiB string as the shard file of every chunk. Each value
    is counted every time it is reached, as every later reader would reach it, and so is each
    string's length; a tensor's name also once per chunk (each chunk's storage entry and
    messages carry it). Real files spend tens of bytes per chunk, so they stay far inside the
    budget. The checks come before the work they pay for: a list's length is charged before
    its items are visited.
    """

    def __init__(self, size: int) -> None:
        self.values_left = VALUES_PER_BYTE * size + BUDGET_BASE
        self.chars_left = CHARS_PER_BYTE * size + BUDGET_BASE

    def values(self, count: int) -> None:
        self.values_left -= count
        if self.values_left < 0:
            raise _Invalid(
                "declares more chunks and values than a file of its size can describe (a shared-reference bomb)"
            )

    def chars(self, count: int) -> None:
        self.chars_left -= count
        if self.chars_left < 0:
            raise _Invalid("names more text than a file of its size can hold (one string shared from many places?)")

    def name(self, value: Any, what: str, fqn: str | None = None) -> str:
        """``value`` as a name (a string of at most MAX_NAME characters), counted against the budget."""
        if type(value) is not str or len(value) > MAX_NAME:
            where = what if fqn is None else f"{_n(fqn)}: {what}"
            if type(value) is not str:
                raise _Invalid(f"{where} is {shown(value)}, not a string")
            raise _Invalid(f"{where} is a string of {len(value)} characters (limit {MAX_NAME})")
        self.chars(len(value))
        return value


@dataclass(frozen=True)
class Kinds:
    """The classes a metadata object graph is made of, and how to read its dtypes and layouts.

    The same conversion reads the restricted unpickler's stand-ins (:data:`RECORD_KINDS`) and
    torch's own objects (the training core indexes the ``Metadata`` its save returned).
    """

    metadata: type
    tensor: type
    bytes_item: type
    chunk: type
    properties: type
    index: type
    storage: type
    storage_meta: type
    dtype_name: Callable[[Any], str | None]  # None: not a dtype
    strided: Callable[[Any], bool]
    records: bool  # stand-ins: every object must hold only its class's FIELDS


RECORD_KINDS = Kinds(
    metadata=_Metadata,
    tensor=_TensorStorageMetadata,
    bytes_item=_BytesStorageMetadata,
    chunk=_ChunkStorageMetadata,
    properties=_TensorProperties,
    index=_MetadataIndex,
    storage=_StorageInfo,
    storage_meta=_StorageMeta,
    dtype_name=lambda d: d.name if type(d) is _DTypeRef else None,
    strided=lambda layout: type(layout) is str and layout == "strided",
    records=True,
)


def table_of(raw: Any, kinds: Kinds, *, size: int, what: str) -> ChunkTable:
    """The checked table of an unpickled ``Metadata`` (raises :class:`CorruptCheckpoint`)."""
    try:
        return _collect(raw, kinds, _Budget(size)).build()
    except (_Invalid, TableError) as e:
        raise CorruptCheckpoint(f"{what}: {e}") from None


def _fields(obj: Any, kinds: Kinds) -> None:
    """A stand-in must hold only its class's fields: C's ``BUILD`` sets any key it is given."""
    if kinds.records:
        extra = obj.__dict__.keys() - type(obj).FIELDS
        if extra:
            name = type(obj).__name__.lstrip("_")
            raise _Invalid(
                f"{name} state holds the field {shown(sorted(map(str, extra))[0])}, which torch's {name} does not have"
            )


def _collect(raw: Any, kinds: Kinds, budget: _Budget) -> TableBuilder:
    if not isinstance(raw, kinds.metadata):
        raise _Invalid("not a DCP Metadata object")
    _fields(raw, kinds)
    b = TableBuilder()
    sdm = getattr(raw, "state_dict_metadata", None)
    if not isinstance(sdm, dict):
        raise _Invalid("state_dict_metadata is not a dict")
    budget.values(len(sdm))
    for fqn, meta in sdm.items():
        name = budget.name(fqn, "a state_dict_metadata key")
        _item(b, name, meta, kinds, budget)

    raw_planner = getattr(raw, "planner_data", None)
    if isinstance(raw_planner, dict):
        budget.values(len(raw_planner))
        for fqn, path in raw_planner.items():
            entry = _planner_entry(fqn, path, budget)
            if entry is not None:
                b.planner[entry[0]] = entry[1]

    raw_storage = getattr(raw, "storage_data", None)
    if not isinstance(raw_storage, dict):
        raise _Invalid("storage_data is not a dict (not written by torch's FileSystemWriter?)")
    budget.values(len(raw_storage))
    _storage(b, raw_storage, kinds, budget)

    meta = getattr(raw, "storage_meta", None)
    if isinstance(meta, kinds.storage_meta):
        b.checkpoint_id = _optional_name(getattr(meta, "checkpoint_id", None), budget)
        b.save_id = _optional_name(getattr(meta, "save_id", None), budget)
        mods = getattr(meta, "modules", None)
        if isinstance(mods, list):
            budget.values(len(mods))
            b.modules = tuple(m for m in (_optional_name(m, budget) for m in mods) if m is not None)
    b.version = _optional_name(getattr(raw, "version", None), budget)
    return b


def _optional_name(value: Any, budget: _Budget) -> str | None:
    """An informational string (the checkpoint id, a module, the version): kept when it is one."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
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


def _shape(v: Any, fqn: str, field: str, budget: _Budget) -> tuple[int, ...]:
    if not isinstance(v, (tuple, list)) or len(v) > MAX_NDIM:
        raise _Invalid(f"{_n(fqn)} {field} is not a size")
    budget.values(1 + len(v))
    for x in v:
        if type(x) is not int or not 0 <= x <= MAX_DIM:
            raise _Invalid(f"{_n(fqn)} {field} holds {shown(x)}, not a non-negative integer")
    return tuple(v)


def _item(b: TableBuilder, fqn: str, meta: Any, kinds: Kinds, budget: _Budget) -> None:
    if isinstance(meta, kinds.bytes_item):
        _fields(meta, kinds)
        b.byte_item(fqn)
        return
    if not isinstance(meta, kinds.tensor):
        raise _Invalid(f"{_n(fqn)}: unknown storage metadata type")
    _fields(meta, kinds)
    props = getattr(meta, "properties", None)
    if not isinstance(props, kinds.properties):
        raise _Invalid(f"{_n(fqn)}: no tensor properties")
    _fields(props, kinds)
    dtype = kinds.dtype_name(getattr(props, "dtype", None))
    if dtype is None:
        raise _Invalid(f"{_n(fqn)}: dtype is not a torch dtype")
    layout = getattr(props, "layout", "strided")
    if not kinds.strided(layout):
        raise _Invalid(f"{_n(fqn)}: layout {shown(layout)} is not supported (only strided tensors)")
    size = _shape(getattr(meta, "size", None), fqn, "size", budget)
    raw_chunks = getattr(meta, "chunks", None)
    if not isinstance(raw_chunks, list):
        raise _Invalid(f"{_n(fqn)}: chunks is not a list")
    count = len(raw_chunks)
    budget.values(count)
    budget.chars(len(fqn) * count)
    t = b.tensor(fqn, dtype, size)
    before = len(b.c_offsets) + len(b.c_sizes)
    chunk_cls, records = kinds.chunk, kinds.records
    fields = _CHUNK_FIELDS
    c_tensor, c_ndim, c_size_ndim = b.c_tensor, b.c_ndim, b.c_size_ndim
    c_offsets, c_sizes = b.c_offsets, b.c_sizes
    c_tensor.extend([t] * count)
    for chunk in raw_chunks:
        if type(chunk) is not chunk_cls and not isinstance(chunk, chunk_cls):
            raise _Invalid(f"{_n(fqn)}: a chunk is not ChunkStorageMetadata")
        if records and not chunk.__dict__.keys() <= fields:
            _fields(chunk, kinds)
        offsets = getattr(chunk, "offsets", None)
        sizes = getattr(chunk, "sizes", None)
        if not isinstance(offsets, tuple) or not isinstance(sizes, tuple):
            offsets = _shape(offsets, fqn, "chunk offsets", budget)
            sizes = _shape(sizes, fqn, "chunk sizes", budget)
        c_ndim.append(len(offsets))
        c_size_ndim.append(len(sizes))
        c_offsets.extend(offsets)
        c_sizes.extend(sizes)
    budget.values(2 * count + len(b.c_offsets) + len(b.c_sizes) - before)


def _storage(b: TableBuilder, raw_storage: dict[Any, Any], kinds: Kinds, budget: _Budget) -> None:
    index_cls, info_cls, records = kinds.index, kinds.storage, kinds.records
    index_fields, info_fields = _INDEX_FIELDS, _INFO_FIELDS
    ids = b.tensor_ids()
    file_ids: dict[str, int] = {}
    s_tensor, s_ndim, s_offsets = b.s_tensor, b.s_ndim, b.s_offsets
    s_file, s_start, s_length, s_transform = b.s_file, b.s_start, b.s_length, b.s_transform
    chars = 0
    values = 0
    for key, info in raw_storage.items():
        if type(key) is not index_cls and not isinstance(key, index_cls):
            raise _Invalid("a storage_data key is not a MetadataIndex")
        if type(info) is not info_cls and not isinstance(info, info_cls):
            raise _Invalid(f"{_n(str(getattr(key, 'fqn', '?')))}: storage info is not a _StorageInfo")
        if records and not (key.__dict__.keys() <= index_fields and info.__dict__.keys() <= info_fields):
            _fields(key, kinds)
            _fields(info, kinds)
        fqn: str = getattr(key, "fqn", None)  # type: ignore[assignment]  # checked on the next line
        if type(fqn) is not str or len(fqn) > MAX_NAME:
            budget.name(fqn, "a MetadataIndex fqn")  # raises: not a string, or too long
        rel: str = getattr(info, "relative_path", None)  # type: ignore[assignment]  # checked next
        if type(rel) is not str or len(rel) > MAX_NAME or not rel:
            if rel == "":
                raise _Invalid(f"{_n(fqn)}: storage relative_path is empty")
            budget.name(rel, "storage relative_path", fqn)
        chars += len(fqn) + len(rel)
        transforms = getattr(info, "transform_descriptors", None) or ()
        transform = _transform(b, fqn, transforms, budget) if transforms else 0
        fid = file_ids.get(rel)
        if fid is None:
            fid = file_ids[rel] = b.file_id(rel)
        offset = getattr(key, "offset", None)
        if offset is None:
            if not b.storage(
                fqn,
                None,
                rel,
                _int(getattr(info, "offset", None), fqn, "storage offset"),
                _int(getattr(info, "length", None), fqn, "storage length"),
                transform,
            ):
                raise _Invalid(f"storage_data lists {_n(fqn)} twice at the same offset")
            continue
        if not isinstance(offset, tuple):
            offset = _shape(offset, fqn, "storage offset", budget)
        values += len(offset)
        s_tensor.append(ids.get(fqn, -1))
        s_ndim.append(len(offset))
        s_offsets.extend(offset)
        s_file.append(fid)
        s_start.append(getattr(info, "offset", None))
        s_length.append(getattr(info, "length", None))
        s_transform.append(transform)
    budget.values(values)
    budget.chars(chars)


def _transform(b: TableBuilder, fqn: str, transforms: Any, budget: _Budget) -> int:
    if not isinstance(transforms, (list, tuple)):
        raise _Invalid(f"{_n(fqn)}: transform_descriptors is not a list of strings")
    budget.values(len(transforms))
    for t in transforms:
        budget.name(t, "a transform descriptor", fqn)
    return b.transform_id(tuple(transforms))


def _int(v: Any, fqn: str, field: str) -> int:
    if type(v) is not int or not 0 <= v <= MAX_OFFSET:
        raise _Invalid(f"{_n(fqn)} {field} is {shown(v)}, not a non-negative integer")
    return v
