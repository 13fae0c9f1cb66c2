"""A DCP checkpoint's ``.metadata`` as columns: one row per chunk, numpy arrays, no per-chunk object.

A 70B model saved by 1024 ranks lists 2.2 million chunks. Kept as Python objects (a dataclass,
two tuples and a storage entry per chunk) that is gigabytes and minutes before any check has
run; kept here it is seven arrays of 2.2 million numbers (about 100 MB) that every check,
summary and plan reads with vectorized numpy, in time linear in the chunk count.

Per tensor (thousands of rows at most, plain lists): name, dtype, shape, the nested-dict path
``planner_data`` gives it, and ``first[t]:first[t+1]``, its rows of the chunk columns.
Per chunk (numpy): ``ndim``, ``offsets`` and ``sizes`` (``[rows, width]``, padded with 0 and
1), and where its bytes are - ``file`` (an index into :attr:`ChunkTable.files`, ``-1`` when
``.metadata`` has no storage entry for the chunk), ``start``, ``length`` and ``transform`` (an
index into :attr:`ChunkTable.transforms`, ``0`` for none). Non-tensor items (``BYTE_IO``) are
few and stay objects (:class:`ByteItem`).

The table describes; it does not judge: :mod:`ckpt_tools.dcp.validate` decides whether the
paths, spans and boxes it lists are sound. It is what a save's index file and the cache hold
(:mod:`ckpt_tools.dcp.index_file`), so it is built one way (:class:`TableBuilder`) whatever it
was read from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckpt_tools.st import dtypes

MAX_NDIM = 64
MAX_DIM = 2**62  # an element count or offset along one dimension
MAX_OFFSET = 2**63 - 1  # a byte offset or length in a shard file
MAX_NAME = 4096  # characters in a name: a tensor's fqn, a shard file, a path (PATH_MAX)
MAX_NUMEL = 2**62  # elements in one tensor: more than any memory holds

PlannerPath = tuple["str | int", ...]


@dataclass(frozen=True)
class ByteItem:
    """A pickled non-tensor object (``BYTE_IO``); ``file`` is None when it has no storage entry."""

    name: str
    path: PlannerPath
    file: str | None
    start: int = 0
    length: int = 0
    transforms: tuple[str, ...] = ()


@dataclass
class ChunkTable:
    names: list[str]
    dtypes: list[str]  # canonical torch names, e.g. "float32"
    shapes: list[tuple[int, ...]]
    paths: list[PlannerPath]
    first: np.ndarray  # int64 [tensors + 1]
    ndim: np.ndarray  # int64 [rows]; -1 - len(sizes) when offsets and sizes differ in length
    offsets: np.ndarray  # int64 [rows, width]
    sizes: np.ndarray  # int64 [rows, width]
    file: np.ndarray  # int64 [rows], -1: no storage entry
    start: np.ndarray  # int64 [rows]
    length: np.ndarray  # int64 [rows]
    transform: np.ndarray  # int64 [rows], index into transforms
    files: list[str]
    transforms: list[tuple[str, ...]]  # transforms[0] == ()
    byte_items: list[ByteItem]
    checkpoint_id: str | None = None
    version: str | None = None
    modules: tuple[str, ...] = ()
    save_id: str | None = None  # storage_meta.save_id: ckpt-train stamps its save's id there (format.rules.save_stamps)
    rank_local: tuple[str, ...] = ()  # the __<r>.metadata files read (their union), when there is no .metadata
    _by_name: dict[str, int] | None = field(default=None, repr=False, compare=False)
    _tensor_of_row: np.ndarray | None = field(default=None, repr=False, compare=False)
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # computed once, by name

    # ------------------------------------------------------------------ shape of the table

    @property
    def rows(self) -> int:
        return int(self.ndim.shape[0])

    @property
    def width(self) -> int:
        return int(self.offsets.shape[1])

    def tensor_id(self, name: str) -> int | None:
        if self._by_name is None:
            self._by_name = {n: i for i, n in enumerate(self.names)}
        return self._by_name.get(name)

    @property
    def item_names(self) -> list[str]:
        """Every item's flattened name: the tensors, then the non-tensor items."""
        return [*self.names, *(b.name for b in self.byte_items)]

    def path_of(self, name: str) -> PlannerPath | None:
        """The nested-dict path of a tensor or non-tensor item, by its flattened name."""
        t = self.tensor_id(name)
        if t is not None:
            return self.paths[t]
        return next((b.path for b in self.byte_items if b.name == name), None)

    def boxes(self, t: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Every chunk of tensor ``t`` as ``(offsets, sizes)``, stored or not, in ``.metadata`` order."""
        rows = self.rows_of(t)
        out = []
        for i in range(rows.start, rows.stop):
            nd = max(int(self.ndim[i]), 0)
            out.append((tuple(self.offsets[i, :nd].tolist()), tuple(self.sizes[i, :nd].tolist())))
        return out

    def rows_of(self, t: int) -> slice:
        return slice(int(self.first[t]), int(self.first[t + 1]))

    @property
    def tensor_of_row(self) -> np.ndarray:
        """For each row, the tensor it belongs to (int64 [rows])."""
        if self._tensor_of_row is None or self._tensor_of_row.shape[0] != self.rows:
            counts = np.diff(self.first)
            self._tensor_of_row = np.repeat(np.arange(len(self.names), dtype=np.int64), counts)
        return self._tensor_of_row

    @property
    def stored(self) -> np.ndarray:
        """Rows that have a storage entry (bool [rows])."""
        return self.file >= 0

    # ------------------------------------------------------------------ per tensor

    def numel(self, t: int) -> int:
        return dtypes.numel(self.shapes[t])

    def itemsize(self, t: int) -> int | None:
        dtype = self.dtypes[t]
        return dtypes.BY_NAME[dtype].itemsize if dtypes.is_known(dtype) else None

    def row_numel(self) -> np.ndarray:
        """Elements per chunk (int64 [rows]): exact for chunks inside their tensor (padding sizes are 1)."""
        if self.rows == 0:
            return np.zeros(0, dtype=np.int64)
        return np.prod(self.sizes, axis=1, dtype=np.int64)

    def referenced_files(self) -> list[str]:
        """Every storage path the items name, in the order ``.metadata`` first names them."""
        ids = self.file[self.file >= 0]
        _, first = np.unique(ids, return_index=True)
        ordered = [self.files[int(i)] for i in ids[np.sort(first)]]
        ordered += [b.file for b in self.byte_items if b.file is not None]
        return list(dict.fromkeys(ordered))


# ====================================================================== building


class TableBuilder:
    """Collects tensors, chunks and storage entries in any order; :meth:`build` joins them.

    Chunks and storage entries are joined on (tensor, chunk offsets) - DCP's ``MetadataIndex``
    identity - with hashing in numpy, so a table of millions of rows is built in seconds.
    Values are kept in flat Python lists while collecting (what an unpickled object graph
    hands out one by one) and checked for type and range once, in bulk, at the end.
    """

    def __init__(self) -> None:
        self.names: list[str] = []
        self.dtypes: list[str] = []
        self.shapes: list[tuple[int, ...]] = []
        self.paths: list[PlannerPath] = []
        self._ids: dict[str, int] = {}
        # chunks, flat: per chunk its tensor, its ndim, then the values of offsets and sizes
        self.c_tensor: list[int] = []
        self.c_ndim: list[int] = []
        self.c_size_ndim: list[int] = []
        self.c_offsets: list[Any] = []
        self.c_sizes: list[Any] = []
        # storage entries for tensor chunks
        self.s_tensor: list[int] = []
        self.s_ndim: list[int] = []
        self.s_offsets: list[Any] = []
        self.s_file: list[int] = []
        self.s_start: list[Any] = []
        self.s_length: list[Any] = []
        self.s_transform: list[int] = []
        self.files: list[str] = []
        self._file_ids: dict[str, int] = {}
        self.transforms: list[tuple[str, ...]] = [()]
        self._transform_ids: dict[tuple[str, ...], int] = {(): 0}
        self.byte_names: list[str] = []
        self.byte_paths: list[PlannerPath] = []
        self.byte_storage: dict[str, tuple[int, int, int, int]] = {}  # name -> file, start, length, transform
        self.checkpoint_id: str | None = None
        self.version: str | None = None
        self.modules: tuple[str, ...] = ()
        self.save_id: str | None = None
        self.rank_local: tuple[str, ...] = ()
        self.planner: dict[str, PlannerPath] = {}

    # ------------------------------------------------------------------ collecting

    def tensor(self, name: str, dtype: str, shape: tuple[int, ...]) -> int:
        t = len(self.names)
        self._ids[name] = t
        self.names.append(name)
        self.dtypes.append(dtype)
        self.shapes.append(shape)
        return t

    def byte_item(self, name: str) -> None:
        self.byte_names.append(name)

    def chunk(self, t: int, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> None:
        self.c_tensor.append(t)
        self.c_ndim.append(len(offsets))
        self.c_size_ndim.append(len(sizes))
        self.c_offsets.extend(offsets)
        self.c_sizes.extend(sizes)

    def file_id(self, name: str) -> int:
        found = self._file_ids.get(name)
        if found is None:
            found = self._file_ids[name] = len(self.files)
            self.files.append(name)
        return found

    def transform_id(self, descriptors: tuple[str, ...]) -> int:
        found = self._transform_ids.get(descriptors)
        if found is None:
            found = self._transform_ids[descriptors] = len(self.transforms)
            self.transforms.append(descriptors)
        return found

    def storage(
        self, name: str, offsets: tuple[int, ...] | None, file: str, start: int, length: int, transform: int
    ) -> bool:
        """Record a storage entry; False when ``offsets`` is None and ``name`` is a byte item listed twice."""
        fid = self.file_id(file)
        if offsets is None:
            if name in self.byte_storage:
                return False
            self.byte_storage[name] = (fid, start, length, transform)
            return True
        t = self._ids.get(name, -1)
        self.s_tensor.append(t)
        self.s_ndim.append(len(offsets))
        self.s_offsets.extend(offsets)
        self.s_file.append(fid)
        self.s_start.append(start)
        self.s_length.append(length)
        self.s_transform.append(transform)
        return True

    def tensor_ids(self) -> dict[str, int]:
        return self._ids

    # ------------------------------------------------------------------ building

    def build(self) -> ChunkTable:
        """The table; raises :class:`TableError` for values out of range or a storage key listed twice."""
        n = len(self.c_tensor)
        if max([*self.c_ndim, *self.c_size_ndim, *self.s_ndim, 0]) > MAX_NDIM:
            raise TableError(f"a chunk has more than {MAX_NDIM} dimensions")
        width = max([*self.c_ndim, *self.c_size_ndim, *self.s_ndim, 1]) if n or self.s_ndim else 1
        c_tensor = np.asarray(self.c_tensor, dtype=np.int64)
        offsets_ndim = np.asarray(self.c_ndim, dtype=np.int64)
        sizes_ndim = np.asarray(self.c_size_ndim, dtype=np.int64)
        offsets = _padded(self.c_offsets, offsets_ndim, width, 0, "chunk offsets")
        sizes = _padded(self.c_sizes, sizes_ndim, width, 1, "chunk sizes")
        # A chunk whose offsets and sizes differ in length is kept with ndim -1 - len(sizes): validation reports it.
        c_ndim = np.where(offsets_ndim == sizes_ndim, offsets_ndim, -1 - sizes_ndim)
        s_ndim = np.asarray(self.s_ndim, dtype=np.int64)
        s_offsets = _padded(self.s_offsets, s_ndim, width, 0, "storage offsets")
        s_start = _checked_ints(self.s_start, MAX_OFFSET, "storage offset")
        s_length = _checked_ints(self.s_length, MAX_OFFSET, "storage length")
        match = _join(c_tensor, offsets_ndim, offsets, self.s_tensor, s_ndim, s_offsets)
        s_file = np.asarray(self.s_file, dtype=np.int64)
        s_transform = np.asarray(self.s_transform, dtype=np.int64)
        has = match >= 0
        pick = np.where(has, match, 0)
        file = np.where(has, s_file[pick] if len(s_file) else -1, -1)
        start = np.where(has, s_start[pick] if len(s_start) else 0, 0)
        length = np.where(has, s_length[pick] if len(s_length) else 0, 0)
        transform = np.where(has, s_transform[pick] if len(s_transform) else 0, 0)
        # rows grouped by tensor, in .metadata order within each tensor
        order = np.argsort(c_tensor, kind="stable")
        counts = np.bincount(c_tensor, minlength=len(self.names)) if n else np.zeros(len(self.names), np.int64)
        first = np.zeros(len(self.names) + 1, dtype=np.int64)
        np.cumsum(counts, out=first[1:])
        byte_items = []
        for name in self.byte_names:
            stored = self.byte_storage.get(name)
            path = self.planner.get(name, (name,))
            if stored is None:
                byte_items.append(ByteItem(name, path, None))
            else:
                fid, b_start, b_length, b_transform = stored
                byte_items.append(
                    ByteItem(name, path, self.files[fid], b_start, b_length, self.transforms[b_transform])
                )
        return ChunkTable(
            names=self.names,
            dtypes=self.dtypes,
            shapes=self.shapes,
            paths=[self.planner.get(name, (name,)) for name in self.names],
            first=first,
            ndim=c_ndim[order],
            offsets=offsets[order],
            sizes=sizes[order],
            file=file[order],
            start=start[order],
            length=length[order],
            transform=transform[order],
            files=self.files,
            transforms=self.transforms,
            byte_items=byte_items,
            checkpoint_id=self.checkpoint_id,
            version=self.version,
            modules=self.modules,
            save_id=self.save_id,
            rank_local=self.rank_local,
        )


class TableError(ValueError):
    """A value no checkpoint can hold (a negative offset, a float where a size belongs) or a storage key twice."""


def _checked_ints(values: list[Any], limit: int, what: str) -> np.ndarray:
    """``values`` as int64, each an ``int`` (not a bool, float or string) in ``[0, limit]``."""
    if not values:
        return np.zeros(0, dtype=np.int64)
    if set(map(type, values)) != {int}:
        bad = next(v for v in values if type(v) is not int)
        raise TableError(f"a {what} is {type(bad).__name__}, not an integer")
    try:
        out = np.asarray(values, dtype=np.int64)
    except OverflowError:
        raise TableError(f"a {what} is beyond 64 bits") from None
    if int(out.min()) < 0 or int(out.max()) > limit:
        bad_value = int(out.min()) if int(out.min()) < 0 else int(out.max())
        raise TableError(f"a {what} is {bad_value}, outside 0..{limit}")
    return out


def _padded(flat: list[Any], ndim: np.ndarray, width: int, pad: int, what: str) -> np.ndarray:
    """Rows of ``ndim[i]`` values each from ``flat``, as ``[rows, width]`` padded with ``pad``."""
    values = _checked_ints(flat, MAX_DIM, what)
    rows = int(ndim.shape[0])
    out = np.full((rows, width), pad, dtype=np.int64)
    if rows == 0 or values.size == 0:
        return out
    if np.all(ndim == ndim[0]):  # the usual case: every row has the same rank
        k = int(ndim[0])
        out[:, :k] = values.reshape(rows, k)
        return out
    row_start = np.zeros(rows, dtype=np.int64)
    np.cumsum(ndim[:-1], out=row_start[1:])
    row_of = np.repeat(np.arange(rows, dtype=np.int64), ndim)
    col = np.arange(values.size, dtype=np.int64) - row_start[row_of]
    out[row_of, col] = values
    return out


_MIX = np.uint64(0x9E3779B97F4A7C15)
_MIX2 = np.uint64(0xBF58476D1CE4E5B9)


def row_hash(columns: list[np.ndarray]) -> np.ndarray:
    """A 64-bit hash per row of int64 ``columns``: equal rows hash equal (callers check collisions)."""
    with np.errstate(over="ignore"):
        h = np.full(columns[0].shape[0], _MIX, dtype=np.uint64)
        for column in columns:
            h = (h ^ column.astype(np.uint64)) * _MIX2
            h ^= h >> np.uint64(31)
    return h


def _row_keys(tensor: np.ndarray, ndim: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """A 64-bit hash per row of (tensor, ndim, offsets); equal rows hash equal, collisions are checked."""
    return row_hash([tensor, ndim, *offsets.T])


def _join(
    c_tensor: np.ndarray,
    c_ndim: np.ndarray,
    c_offsets: np.ndarray,
    s_tensor_list: list[int],
    s_ndim: np.ndarray,
    s_offsets: np.ndarray,
) -> np.ndarray:
    """For each chunk, the storage entry with the same (tensor, ndim, offsets), or -1."""
    n = int(c_tensor.shape[0])
    s_tensor = np.asarray(s_tensor_list, dtype=np.int64)
    m = int(s_tensor.shape[0])
    if n == 0 or m == 0:
        return np.full(n, -1, dtype=np.int64)
    s_keys = _row_keys(s_tensor, s_ndim, s_offsets)
    order = np.argsort(s_keys, kind="stable")
    sorted_keys = s_keys[order]
    same = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
    if same.size:
        a, b = order[same], order[same + 1]
        equal = (s_tensor[a] == s_tensor[b]) & (s_ndim[a] == s_ndim[b]) & np.all(s_offsets[a] == s_offsets[b], axis=1)
        real = equal & (s_tensor[a] >= 0)
        if real.any():
            raise TableError("storage_data lists a chunk twice at the same offset")
        if not equal.all():
            return _join_exact(c_tensor, c_ndim, c_offsets, s_tensor, s_ndim, s_offsets)
    c_keys = _row_keys(c_tensor, c_ndim, c_offsets)
    pos = np.minimum(np.searchsorted(sorted_keys, c_keys), m - 1)
    found = sorted_keys[pos] == c_keys
    cand = order[pos]
    exact = (s_tensor[cand] == c_tensor) & (s_ndim[cand] == c_ndim) & np.all(s_offsets[cand] == c_offsets, axis=1)
    if np.any(found & ~exact):  # a hash collision between different keys: join the slow, exact way
        return _join_exact(c_tensor, c_ndim, c_offsets, s_tensor, s_ndim, s_offsets)
    return np.where(found, cand, -1)


def _join_exact(
    c_tensor: np.ndarray,
    c_ndim: np.ndarray,
    c_offsets: np.ndarray,
    s_tensor: np.ndarray,
    s_ndim: np.ndarray,
    s_offsets: np.ndarray,
) -> np.ndarray:
    """The join by Python dict, for tables whose row hashes collide (never seen on a real checkpoint)."""
    where: dict[tuple[int, ...], int] = {}
    for i in range(int(s_tensor.shape[0])):
        key = (int(s_tensor[i]), *s_offsets[i, : s_ndim[i]].tolist())
        if key in where and key[0] >= 0:
            raise TableError("storage_data lists a chunk twice at the same offset")
        where[key] = i
    out = np.full(int(c_tensor.shape[0]), -1, dtype=np.int64)
    for i in range(int(c_tensor.shape[0])):
        nd = max(int(c_ndim[i]), 0)
        out[i] = where.get((int(c_tensor[i]), *c_offsets[i, :nd].tolist()), -1)
    return out
