"""Read one saved tensor chunk out of a ``.distcp`` file, torch-free.

A chunk's span is a torch.save archive: ``data.pkl`` says (through ``_rebuild_tensor_v2`` or
``_v3``) which storage the tensor views, at what storage offset, with what size and stride;
``data/<key>`` holds the storage's raw bytes; ``byteorder`` says their endianness. We parse
``data.pkl`` with a restricted unpickler (only those rebuild functions, the storage classes,
dtypes and OrderedDict) and return a :class:`ChunkLayout`: enough to copy the bytes straight
from the file into their place in the output, honouring offset, stride and byte order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckpt_tools.dcp.safe_pickle import restricted_loads
from ckpt_tools.dcp.zipblob import SpanReader, ZipDirectory, read_directory
from ckpt_tools.errors import CorruptCheckpoint
from ckpt_tools.io.remote import Readable
from ckpt_tools.st import dtypes
from ckpt_tools.st.dtypes import DType

_MAX_PICKLE_BYTES = 1 * 2**20  # data.pkl of one tensor is ~150 bytes
MAX_EXPANDED_BYTES = 64 * 2**20  # an expanded (self-overlapping) view may stand for this much, no more


@dataclass(frozen=True)
class _StorageType:
    dtype: str | None  # None: UntypedStorage (bytes; the dtype comes with _rebuild_tensor_v3)


@dataclass(frozen=True)
class _StorageRef:
    key: str
    dtype: str | None
    numel: int


@dataclass(frozen=True)
class TensorRecord:
    storage: _StorageRef
    storage_offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str


def _ints(v: Any, what: str) -> tuple[int, ...]:
    if not isinstance(v, (tuple, list)) or len(v) > 64:
        raise ValueError(f"{what} is not a tuple of ints")
    out = tuple(v)
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**62 for x in out):
        raise ValueError(f"{what} holds a bad value")
    return out


def _rebuild_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, *_rest: Any) -> TensorRecord:
    if not isinstance(storage, _StorageRef) or storage.dtype is None:
        raise ValueError("_rebuild_tensor_v2 without a typed storage")
    return _record(storage, storage_offset, size, stride, storage.dtype)


def _rebuild_v3(
    storage: Any, storage_offset: Any, size: Any, stride: Any, _grad: Any, _hooks: Any, dtype: Any, *_rest: Any
) -> TensorRecord:
    if not isinstance(storage, _StorageRef) or not isinstance(dtype, _DTypeName):
        raise ValueError("_rebuild_tensor_v3 without a storage and a dtype")
    return _record(storage, storage_offset, size, stride, dtype.name)


def _record(storage: _StorageRef, storage_offset: Any, size: Any, stride: Any, dtype: str) -> TensorRecord:
    if not isinstance(storage_offset, int) or isinstance(storage_offset, bool) or storage_offset < 0:
        raise ValueError("bad storage offset")
    size_t, stride_t = _ints(size, "size"), _ints(stride, "stride")
    if len(size_t) != len(stride_t):
        raise ValueError("size and stride differ in length")
    return TensorRecord(storage, storage_offset, size_t, stride_t, dtype)


@dataclass(frozen=True)
class _DTypeName:
    name: str


def _data_allowlist() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_v2,
        ("torch._utils", "_rebuild_tensor_v3"): _rebuild_v3,
        ("collections", "OrderedDict"): dict,  # backward hooks: OrderedDict(), a fresh dict
        ("torch", "UntypedStorage"): _StorageType(None),
        ("torch.storage", "UntypedStorage"): _StorageType(None),
    }
    for cls, dtype in dtypes.STORAGE_CLASSES.items():
        allowed[("torch", cls)] = _StorageType(dtype)
    for name in dtypes.TORCH_DTYPE_NAMES:
        allowed[("torch", name)] = _DTypeName(dtypes.canonical_name(name))
    return allowed


TENSOR_ALLOWLIST = _data_allowlist()


def storage_reference(pid: Any) -> _StorageRef:
    # torch.save: ("storage", storage_type, key, location, numel)
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
        raise ValueError("unknown persistent id")
    _, storage_type, key, _location, numel = pid
    if not isinstance(storage_type, _StorageType) or not isinstance(key, str) or not isinstance(numel, int):
        raise ValueError("malformed storage reference")
    if numel < 0 or "/" in key or key in ("", ".", ".."):
        raise ValueError("malformed storage reference")
    return _StorageRef(key=key, dtype=storage_type.dtype, numel=numel)


@dataclass(frozen=True)
class ChunkLayout:
    """Where one chunk's elements are, in the file: ``data_offset`` is absolute, in bytes."""

    dtype: DType
    size: tuple[int, ...]
    stride: tuple[int, ...]  # in elements
    data_offset: int  # absolute file offset of element [0, 0, ...] (storage start + storage offset)
    byteorder: str  # "little" or "big"

    @property
    def numel(self) -> int:
        return dtypes.numel(self.size)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def contiguous(self) -> bool:
        """Row-major with no gaps: the chunk's bytes are one run starting at ``data_offset``."""
        expected = 1
        for size, stride in zip(reversed(self.size), reversed(self.stride), strict=True):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


_RECORD_CACHE: dict[bytes, Any] = {}
_RECORD_CACHE_MAX = 4096


def _tensor_record(pickled: bytes, what: str) -> Any:
    """Unpickle one data.pkl; identical blobs (same dtype, shape and stride) are parsed once.

    Thousands of chunks of a large checkpoint share a handful of distinct data.pkl blobs, and
    the parse is a pure function of the bytes, so the cache only saves time.
    """
    record = _RECORD_CACHE.get(pickled)
    if record is None:
        record = restricted_loads(pickled, TENSOR_ALLOWLIST, what=what, persistent_load=storage_reference)
        if len(_RECORD_CACHE) < _RECORD_CACHE_MAX:
            _RECORD_CACHE[pickled] = record
    return record


def read_chunk_layout(fd: Readable, start: int, length: int, *, what: str) -> ChunkLayout:
    """Parse the torch.save archive in ``[start, start+length)`` of ``fd`` (headers only)."""
    return read_chunk_archive(fd, start, length, what=what)[0]


def read_chunk_archive(fd: Readable, start: int, length: int, *, what: str) -> tuple[ChunkLayout, ArchiveShape]:
    """:func:`read_chunk_layout`, and where in the span its headers are (:class:`ArchiveShape`)."""
    span = SpanReader(fd, start, length, what)
    members = read_directory(span)
    pkl = members.member("data.pkl")
    if pkl is None:
        raise CorruptCheckpoint(f"{what}: torch.save archive without data.pkl")
    if pkl.size > _MAX_PICKLE_BYTES:
        raise CorruptCheckpoint(f"{what}: data.pkl of {pkl.size} bytes is not a single tensor")
    record = _tensor_record(span.read(pkl.offset, pkl.size), what)
    if not isinstance(record, TensorRecord):
        raise CorruptCheckpoint(f"{what}: chunk does not hold a tensor")
    layout = tensor_layout(record, members, start, what=what)
    data = members.member(f"data/{record.storage.key}")
    assert data is not None  # tensor_layout found it
    ignored = list(members.crc_fields())
    serial = members.member(".data/serialization_id")
    shape = ArchiveShape(
        data_start=data.offset,
        data_end=data.offset + data.size,
        ignored=tuple(sorted(ignored)),
        serialization_id=(serial.offset, serial.offset + serial.size) if serial is not None else None,
    )
    return layout, shape


def tensor_layout(record: TensorRecord, members: ZipDirectory, start: int, *, what: str) -> ChunkLayout:
    """Where the tensor ``record`` (from ``data.pkl``) lies in the archive ``members`` (at file offset ``start``).

    Checks that its storage is in the archive and holds every element it views, and refuses an
    expanded view that would stand for far more bytes than are stored.
    """
    byteorder = "little"
    order_member = members.member("byteorder")
    if order_member is not None:
        byteorder = members.span.read(order_member.offset, min(order_member.size, 16)).decode("ascii", "replace")
        if byteorder not in ("little", "big"):
            raise CorruptCheckpoint(f"{what}: unknown byte order {byteorder!r}")
    data = members.member(f"data/{record.storage.key}")
    if data is None:
        raise CorruptCheckpoint(f"{what}: storage data/{record.storage.key} missing from the archive")
    dtype = dtypes.lookup(record.dtype, what=what)
    storage_bytes = record.storage.numel * (dtype.itemsize if record.storage.dtype is not None else 1)
    if data.size < storage_bytes:
        raise CorruptCheckpoint(f"{what}: storage holds {data.size} bytes, its header promises {storage_bytes}")
    extent = (
        0
        if any(s == 0 for s in record.size)
        else 1 + sum((s - 1) * st for s, st in zip(record.size, record.stride, strict=True))
    )
    needed = (record.storage_offset + extent) * dtype.itemsize if extent else 0
    if needed > data.size:
        raise CorruptCheckpoint(f"{what}: tensor needs {needed} bytes of storage, the archive has {data.size}")
    numel = 0 if extent == 0 else dtypes.numel(record.size)
    if numel > extent and numel * dtype.itemsize > MAX_EXPANDED_BYTES:
        # Zero or overlapping strides (an ``expand``ed view) turn a few stored bytes into a
        # tensor of any size: fine for a small buffer, a memory bomb beyond that.
        raise CorruptCheckpoint(
            f"{what}: a {list(record.size)} {dtype.name} tensor viewed from {extent} stored elements"
            f" (strides {list(record.stride)}): expanded views larger than {MAX_EXPANDED_BYTES} bytes are refused"
        )
    return ChunkLayout(
        dtype=dtype,
        size=record.size,
        stride=record.stride,
        data_offset=start + data.offset + record.storage_offset * dtype.itemsize,
        byteorder=byteorder,
    )


@dataclass(frozen=True)
class ArchiveShape:
    """Where an archive's headers are in its span: all bytes but the storage data ``[data_start, data_end)``.

    ``ignored`` (CRC-32 fields, 4 bytes each) and ``serialization_id`` (the random id torch.save
    writes) are bytes the parse above never reads: two archives whose other header bytes are
    equal parse to the same layout (:mod:`ckpt_tools.dcp.archives`).
    """

    data_start: int
    data_end: int
    ignored: tuple[int, ...]
    serialization_id: tuple[int, int] | None


def read_pickled_object(
    fd: Readable, start: int, length: int, allowed: dict[tuple[str, str], Any], *, what: str
) -> Any:
    """Restricted-load the object of a BYTE_IO item (a torch.save archive of a plain object)."""
    span = SpanReader(fd, start, length, what)
    pkl = read_directory(span).member("data.pkl")
    if pkl is None:
        raise CorruptCheckpoint(f"{what}: torch.save archive without data.pkl")
    if pkl.size > _MAX_PICKLE_BYTES:
        raise CorruptCheckpoint(f"{what}: pickled object of {pkl.size} bytes is too large to decode")
    return restricted_loads(span.read(pkl.offset, pkl.size), allowed, what=what)
