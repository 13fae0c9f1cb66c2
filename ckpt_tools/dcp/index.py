"""The chunk index: for every tensor of a DCP checkpoint, which bytes of which file hold which box.

It is what every tool works from (convert, inspect, reshard-plan, verify-resume) and what the
trainer checks before torch's loader runs. Its data is a :class:`~ckpt_tools.dcp.table.ChunkTable`
- columns, read from the save's index, the cache or ``.metadata``
(:mod:`ckpt_tools.dcp.sources`) - and the whole-checkpoint questions (which files, which
ranks, how many bytes) are answered on those columns. Per-tensor views (:class:`TensorEntry`,
with its :class:`Chunk` objects made on demand) serve the code that handles one tensor at a
time: converting it, reading a scalar.

It describes; it does not judge: whether the paths, spans, boxes and archives it lists are
sound is decided in :mod:`ckpt_tools.dcp.validate`, once for every reader.

Within one process a directory is loaded once while its ``.metadata`` (and index) stay the
same: ``verify-resume`` and the trainer's resume ask for the optimizer's index from several
checks, and a 400 MB ``.metadata`` must not be read four times.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ckpt_tools.dcp import sources
from ckpt_tools.dcp.files import Listed, is_inside, listing
from ckpt_tools.dcp.table import ChunkTable
from ckpt_tools.errors import CheckpointError, CkptError
from ckpt_tools.format.layout import DCP_INDEX, DCP_METADATA
from ckpt_tools.io.remote import as_path
from ckpt_tools.st import dtypes

_RANK_FILE_RE = re.compile(r"^__(\d+)_(\d+)\.distcp$")
_MEMO_SIZE = 4


@dataclass(frozen=True)
class Chunk:
    """One saved box of a tensor and the span of the file holding its torch.save archive."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str  # relative to the DCP directory
    offset: int
    length: int
    transforms: tuple[str, ...] = ()  # torch's stream transforms (zstd) applied to the span

    @property
    def numel(self) -> int:
        return dtypes.numel(self.sizes)


class TensorEntry:
    """One tensor of the index: name, path, dtype, shape, and its stored chunks on demand."""

    __slots__ = ("__dict__", "dtype", "fqn", "path", "shape", "t", "table")

    def __init__(self, table: ChunkTable, t: int) -> None:
        self.table = table
        self.t = t
        self.fqn = table.names[t]  # DCP's flattened key, e.g. "model.encoder.weight"
        self.path = table.paths[t]  # the nested-dict path, e.g. ("model", "encoder.weight")
        self.dtype = table.dtypes[t]
        self.shape = table.shapes[t]

    @cached_property
    def chunks(self) -> tuple[Chunk, ...]:
        """Chunks with a storage entry (the others are reported by validation), in ``.metadata`` order."""
        tb = self.table
        rows = tb.rows_of(self.t)
        out = []
        for i in range(rows.start, rows.stop):
            f = int(tb.file[i])
            if f < 0:
                continue
            nd = max(int(tb.ndim[i]), 0)
            out.append(
                Chunk(
                    tuple(tb.offsets[i, :nd].tolist()),
                    tuple(tb.sizes[i, :nd].tolist()),
                    tb.files[f],
                    int(tb.start[i]),
                    int(tb.length[i]),
                    tb.transforms[int(tb.transform[i])],
                )
            )
        return tuple(out)

    @property
    def rows(self) -> slice:
        return self.table.rows_of(self.t)

    @property
    def numel(self) -> int:
        return dtypes.numel(self.shape)

    @property
    def itemsize(self) -> int | None:
        return dtypes.BY_NAME[self.dtype].itemsize if dtypes.is_known(self.dtype) else None

    @property
    def nbytes(self) -> int | None:
        size = self.itemsize
        return None if size is None else size * self.numel


@dataclass(frozen=True)
class BytesEntry:
    """A pickled non-tensor object (optimizer hyper-parameters, say); never loaded unrestricted."""

    fqn: str
    path: tuple[str | int, ...]
    file: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()


@dataclass(frozen=True)
class RankShard:
    """What one saving rank wrote: its ``__{rank}_{n}.distcp`` files, their bytes and chunks."""

    rank: int
    files: tuple[str, ...]
    file_bytes: int
    chunk_bytes: int
    chunks: int


class ChunkIndex:
    def __init__(self, root: Path, table: ChunkTable, origin: sources.Origin | None = None) -> None:
        self.root = as_path(root)
        self.table = table
        self.origin = origin or sources.Origin("metadata")

    # ------------------------------------------------------------------ building

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ChunkIndex:
        """The index of a DCP directory; raises only if its metadata is unusable (or a symlink out)."""
        root = as_path(directory)
        if not root.is_dir():
            raise CheckpointError(f"{root}: not a directory")
        key = _memo_key(root)
        if key is not None:
            found = _MEMO.get(key)
            if found is not None:
                _MEMO.move_to_end(key)
                if isinstance(found, CkptError):  # the same unchanged file: the same refusal, no second parse
                    raise type(found)(str(found))
                return cls(root, found.table, found.origin)  # under the path this caller named
        try:
            table, origin = sources.load_table(root)
        except CkptError as e:
            if key is not None:
                _remember(key, e)
            raise
        index = cls(root, table, origin)
        if key is not None and origin.source != "rank-local":
            _remember(key, index)
        return index

    @classmethod
    def from_table(cls, root: Path, table: ChunkTable) -> ChunkIndex:
        return cls(root, table)

    # ------------------------------------------------------------------ per-item views

    @cached_property
    def tensors(self) -> dict[str, TensorEntry]:
        return {name: TensorEntry(self.table, t) for t, name in enumerate(self.table.names)}

    @cached_property
    def byte_items(self) -> dict[str, BytesEntry]:
        """Non-tensor items with a storage entry (the others are reported by validation)."""
        return {
            b.name: BytesEntry(b.name, b.path, b.file, b.start, b.length, b.transforms)
            for b in self.table.byte_items
            if b.file is not None
        }

    @property
    def chunk_count(self) -> int:
        return int(np.count_nonzero(self.table.file >= 0))

    # ------------------------------------------------------------------ whole-checkpoint views

    def referenced_files(self) -> list[str]:
        """Every storage path the items name, in the order ``.metadata`` first names them."""
        return self.table.referenced_files()

    def top_level_keys(self) -> set[str | int]:
        keys = {p[0] for p in self.table.paths if p}
        keys |= {b.path[0] for b in self.table.byte_items if b.path and b.file is not None}
        return keys

    def ranks(self) -> list[RankShard]:
        """Per saving rank, from the ``__{rank}_{n}.distcp`` names torch's writer uses.

        Files a rank wrote that hold no chunk (an HSDP replica, say) still count as its output;
        a named file that is missing, or a symlink out of the directory, counts 0 bytes.
        """
        tb = self.table
        listed = listing(self.root)
        present = {name: entry for name, entry in listed.items() if name.endswith(".distcp")}
        stored = tb.file >= 0
        per_file_bytes = np.bincount(tb.file[stored], weights=None, minlength=len(tb.files))
        per_file_len = _sum_by(tb.file[stored], tb.length[stored], len(tb.files))
        per_rank: dict[int, dict[str, int]] = {}
        chunk_bytes: dict[int, int] = {}
        chunk_count: dict[int, int] = {}
        for name in [*self.referenced_files(), *present]:
            m = _RANK_FILE_RE.match(name)
            if m:
                files = per_rank.setdefault(int(m.group(1)), {})
                if name not in files:
                    files[name] = _size_inside(self.root, name, present.get(name))
        for f, name in enumerate(tb.files):
            m = _RANK_FILE_RE.match(name)
            if m:
                r = int(m.group(1))
                chunk_bytes[r] = chunk_bytes.get(r, 0) + int(per_file_len[f])
                chunk_count[r] = chunk_count.get(r, 0) + int(per_file_bytes[f])
        return [
            RankShard(
                rank=r,
                files=tuple(sorted(files)),
                file_bytes=sum(files.values()),
                chunk_bytes=chunk_bytes.get(r, 0),
                chunks=chunk_count.get(r, 0),
            )
            for r, files in sorted(per_rank.items())
        ]

    def unreferenced_files(self) -> list[str]:
        """``.distcp`` files in the directory that ``.metadata`` never mentions.

        Empty ``__<rank>_<n>.distcp`` files are not counted: torch's writer creates one per
        writer thread even when the thread gets nothing to write (an HSDP replica, a rank with
        fewer items than threads).
        """
        referenced = set(self.referenced_files())
        return sorted(
            name
            for name, entry in listing(self.root).items()
            if name.endswith(".distcp")
            and name not in referenced
            and not (entry.size == 0 and entry.regular and _RANK_FILE_RE.match(name))
        )

    # ------------------------------------------------------------------ archives

    def archives_known_good(self) -> bool:
        """Whether every shard file is unchanged since its chunk archives were known sound (index, cache)."""
        return self.origin.archives_known_good(self.root, self.table.files)

    def remember_archives_checked(self) -> None:
        self.origin.remember_checked(self.root, self.table.files)


def _sum_by(groups: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Exact int64 sums of ``values`` per group id (bincount's float weights lose bits past 2**53)."""
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, groups, values)
    return out


_MEMO: OrderedDict[tuple[object, ...], ChunkIndex | CkptError] = OrderedDict()


def _remember(key: tuple[object, ...], value: ChunkIndex | CkptError) -> None:
    _MEMO[key] = value
    while len(_MEMO) > _MEMO_SIZE:
        _MEMO.popitem(last=False)


def _memo_key(root: Path) -> tuple[object, ...] | None:
    """The identity of a directory's ``.metadata`` and index, and of the reading settings; None: do not memoize."""
    parts: list[object] = [
        os.path.realpath(root),
        sources._enabled(sources._use_index),
        sources._enabled(sources._use_cache),
    ]
    for name in (DCP_METADATA, DCP_INDEX):
        try:
            st = os.stat(root / name)
        except FileNotFoundError:
            if name == DCP_METADATA:
                return None
            parts.append(None)
            continue
        except (OSError, ValueError):
            return None
        parts.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(parts)


def forget() -> None:
    """Drop the loaded indexes (tests that rewrite a directory in place within one second)."""
    _MEMO.clear()


def _size_inside(root: Path, name: str, entry: Listed | None) -> int:
    """Bytes of a shard file; 0 when missing, or a symlink that leads out of the directory."""
    if entry is None:
        return 0
    if not entry.symlink:
        return entry.size if entry.regular else 0
    path = root / name
    if not is_inside(root, path):
        return 0
    try:
        return path.stat().st_size
    except OSError:
        return 0
