"""Check every chunk archive of a DCP directory against ``.metadata``, at a few microseconds a chunk.

Each chunk's span is a ``torch.save`` archive; its headers (zip records, ``data.pkl``) say
which dtype and shape it holds, and a shard overwritten in place or a chunk re-pointed at
another archive shows only there. Parsing a zip directory and a pickle per chunk costs tens
of microseconds - a minute for the 2.2 million chunks of a 70B model on 1024 ranks - yet
the archives of one tensor's chunks are byte for byte the same apart from their tensor data,
the CRC-32 fields and the random id torch.save writes.

So the first chunk of each kind (dtype, box size, span length) is parsed in full
(:func:`~ckpt_tools.dcp.reader.read_chunk_archive`) and becomes a template: its header bytes,
with the bytes that parse never reads (:class:`~ckpt_tools.dcp.reader.ArchiveShape`) masked.
Every other chunk of that kind reads only its header bytes (two ``pread`` calls, or one for a
small chunk) and compares them, masked, with the template: equal bytes parse to the same
layout, so the chunk holds what ``.metadata`` says. A chunk that differs anywhere else is
parsed in full, as before - the comparison only ever saves work, it never decides alone that
an archive is bad.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace

import numpy as np

from ckpt_tools.dcp.files import ShardFiles
from ckpt_tools.dcp.reader import ArchiveShape, ChunkLayout, read_chunk_archive
from ckpt_tools.dcp.table import ChunkTable, row_hash
from ckpt_tools.errors import CorruptCheckpoint
from ckpt_tools.st import dtypes

ARCHIVE_SLACK = 1 * 2**20  # what a transformed (zstd) span may expand to beyond its tensor bytes
SMALL_SPAN = 16 * 2**10  # a span this short is read in one call
BATCH_ROWS = 2048  # chunks whose header bytes are compared at once (a few MiB of index arrays)


@dataclass
class _Template:
    shape: ArchiveShape
    mask: int  # 1 bits where a header byte must equal the template's
    expected: int  # the template's header bytes, masked
    length: int
    layout: ChunkLayout  # with data_offset relative to the span's start
    raw: np.ndarray  # the template's header bytes (uint8)
    checked: np.ndarray  # True where a header byte must equal the template's

    def layout_at(self, start: int) -> ChunkLayout:
        return replace(self.layout, data_offset=start + self.layout.data_offset)


def _header_bytes(fd: int, start: int, length: int, shape: ArchiveShape) -> bytes | None:
    """Head and tail of the span (everything but the storage data), or None on a short read."""
    head, tail_len = shape.data_start, length - shape.data_end
    if length <= SMALL_SPAN:
        whole = os.pread(fd, length, start)
        if len(whole) != length:
            return None
        return whole[:head] + whole[shape.data_end :]
    first = os.pread(fd, head, start)
    last = os.pread(fd, tail_len, start + shape.data_end)
    if len(first) != head or len(last) != tail_len:
        return None
    return first + last


def _template(fd: int, start: int, length: int, shape: ArchiveShape, layout: ChunkLayout) -> _Template | None:
    raw = _header_bytes(fd, start, length, shape)
    if raw is None:
        return None
    head = shape.data_start
    masked = bytearray(b"\xff" * len(raw))

    def clear(a: int, b: int) -> None:
        # a span position to a position in the head+tail bytes; data bytes are not in them
        for pos in range(a, b):
            if pos < head:
                masked[pos] = 0
            elif pos >= shape.data_end:
                masked[pos - shape.data_end + head] = 0

    for pos in shape.ignored:
        clear(pos, pos + 4)
    if shape.serialization_id is not None:
        clear(*shape.serialization_id)
    mask = int.from_bytes(masked, "little")
    relative = replace(layout, data_offset=layout.data_offset - start)
    checked = np.frombuffer(bytes(masked), dtype=np.uint8) != 0
    return _Template(
        shape, mask, int.from_bytes(raw, "little") & mask, length, relative, np.frombuffer(raw, np.uint8), checked
    )


class ArchiveChecker:
    """Checks chunks' archives in table order; the first mismatch raises :class:`CorruptCheckpoint`."""

    def __init__(self, table: ChunkTable, files: ShardFiles) -> None:
        self.table = table
        self.files = files
        self._templates: dict[int, _Template | None] = {}  # by kind
        if "archive kinds" not in table.derived:
            table.derived["archive kinds"] = _kinds(table)
        self.kinds = table.derived["archive kinds"]

    def check_rows(self, rows: np.ndarray) -> None:
        """Check the archives of ``rows`` (stored ones): raises on the first bad one.

        Rows are visited in file order. DCP writes a file's archives back to back, so one
        chunk's tail and the next one's head are neighbours: a single ``pread`` serves both.
        """
        tb = self.table
        order = rows[np.lexsort((tb.start[rows], tb.file[rows]))]
        advised_fds: list[int] = []  # descriptors told they are read at scattered offsets
        try:
            self._visit(order, advised_fds)
        finally:
            _stream(advised_fds)

    def _visit(self, order: np.ndarray, advised_fds: list[int]) -> None:
        tb = self.table
        tensor_of = tb.tensor_of_row
        batch = _Batch()
        pending: tuple[int, int, int, int] | None = None  # (row, fd, tail start, end): head read, tail not yet
        advised = -1  # the file whose descriptor was advised last
        for i, f, start, length, kind, transformed in zip(
            order.tolist(),
            tb.file[order].tolist(),
            tb.start[order].tolist(),
            tb.length[order].tolist(),
            self.kinds[order].tolist(),
            tb.transform[order].tolist(),
            strict=True,
        ):
            template = self._templates.get(kind, False)
            if not template or transformed or length != template.length:
                pending = self._tail(batch, pending)
                self._judge(batch)  # earlier rows first: the error raised is the first in file order
                self.layout(i, int(tensor_of[i]))
                continue
            fd = self.files.fd(tb.files[f])
            if f != advised:
                _headers_only(fd)
                advised = f
                advised_fds.append(fd)
            head = template.shape.data_start
            if pending is not None and pending[1] == fd and pending[3] == start:
                tail = start - pending[2]
                batch.read(fd, pending[2], tail=tail, head=head)
            else:
                pending = self._tail(batch, pending)
                batch.read(fd, start, head=head)
            batch.add(i, kind)
            pending = (i, fd, start + template.shape.data_end, start + length)
            if batch.full():
                pending = self._tail(batch, pending)
                self._judge(batch)
        self._tail(batch, pending)
        self._judge(batch)

    @staticmethod
    def _tail(batch: _Batch, pending: tuple[int, int, int, int] | None) -> None:
        """Read the tail of ``pending`` on its own (None: nothing to do)."""
        if pending is not None:
            _, fd, tail_start, end = pending
            batch.read(fd, tail_start, tail=end - tail_start)
        return None

    def _judge(self, batch: _Batch) -> None:
        """Header bytes equal to their template's (masked), all of a kind at once: sound; else the full parse decides."""
        if not batch.rows:
            return
        buffer = np.frombuffer(b"".join(batch.pieces), dtype=np.uint8)
        rows = np.asarray(batch.rows, dtype=np.int64)
        kinds = np.asarray(batch.kinds, dtype=np.int64)
        suspect = np.zeros(rows.size, dtype=bool)
        heads = np.asarray(batch.head_at, dtype=np.int64)
        tails = np.asarray(batch.tail_at, dtype=np.int64)
        for kind in np.unique(kinds).tolist():
            template = self._templates[kind]
            assert template is not None
            members = np.flatnonzero(kinds == kind)
            head, tail = template.shape.data_start, template.length - template.shape.data_end
            where = np.concatenate(
                (heads[members, None] + np.arange(head), tails[members, None] + np.arange(tail)), axis=1
            )
            bad = ((buffer[np.clip(where, 0, max(buffer.size - 1, 0))] != template.raw) & template.checked).any(axis=1)
            suspect[members] = bad | (heads[members] < 0) | (tails[members] < 0)
        for k in np.flatnonzero(suspect).tolist():  # in file order: the first bad one raises
            i = int(rows[k])
            self.parse(i, int(self.table.tensor_of_row[i]))
        batch.clear()

    def layout(self, i: int, t: int) -> ChunkLayout:
        """Row ``i``'s (of tensor ``t``) archive layout, checked against ``.metadata``."""
        tb = self.table
        kind = int(self.kinds[i])
        template = self._templates.get(kind, False)
        transformed = bool(tb.transform[i])
        if template and not transformed and int(tb.length[i]) == template.length:
            fd = self.files.fd(tb.files[int(tb.file[i])])
            start = int(tb.start[i])
            raw = _header_bytes(fd, start, template.length, template.shape)
            if raw is not None and int.from_bytes(raw, "little") & template.mask == template.expected:
                return template.layout_at(start)
        layout, shape = self.parse(i, t)
        if template is False and not transformed:
            fd = self.files.fd(tb.files[int(tb.file[i])])
            self._templates[kind] = _template(fd, int(tb.start[i]), int(tb.length[i]), shape, layout)
        return layout

    def parse(self, i: int, t: int) -> tuple[ChunkLayout, ArchiveShape]:
        """Row ``i``'s archive parsed in full and checked against ``.metadata``."""
        tb = self.table
        nd = max(int(tb.ndim[i]), 0)
        sizes = tuple(tb.sizes[i, :nd].tolist())
        file = tb.files[int(tb.file[i])]
        name = tb.names[t]
        what = f"{file} ({name} chunk at {tb.offsets[i, :nd].tolist()})"
        itemsize = (tb.itemsize(t) or 16) if dtypes.is_known(tb.dtypes[t]) else 16
        numel = int(np.prod(sizes, dtype=np.int64)) if sizes else 1
        stored = _Stored(file, int(tb.start[i]), int(tb.length[i]), tb.transforms[int(tb.transform[i])])
        fd, start, length = self.files.span(stored, limit=numel * itemsize + ARCHIVE_SLACK)
        layout, shape = read_chunk_archive(fd, start, length, what=what)
        if layout.dtype.name != dtypes.canonical_name(tb.dtypes[t]) or layout.size != sizes:
            raise CorruptCheckpoint(
                f"{what}: holds {layout.dtype.name}{list(layout.size)}, .metadata says {tb.dtypes[t]}{list(sizes)}"
            )
        return layout, shape


class _Batch:
    """Header bytes read for up to :data:`BATCH_ROWS` chunks, judged together against their templates.

    The reads go into ``pieces`` back to back; ``head_at`` / ``tail_at`` say where each row's
    head and tail start in their concatenation (-1: a short read, the row is parsed in full).
    A row's tail is always read after its head and before the next row is added.
    """

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.rows: list[int] = []
        self.kinds: list[int] = []
        self.head_at: list[int] = []
        self.tail_at: list[int] = []
        self._size = 0
        self._head = -1  # where the head read last (for the row added next) starts

    def read(self, fd: int, offset: int, *, tail: int = 0, head: int = 0) -> None:
        """One ``pread``: the last added row's ``tail`` bytes, then the next row's ``head`` bytes."""
        piece = os.pread(fd, tail + head, offset)
        whole = len(piece) == tail + head
        if tail:
            self.tail_at[-1] = self._size if whole else -1
        if head:
            self._head = self._size + tail if whole else -1
        self.pieces.append(piece)
        self._size += len(piece)

    def add(self, row: int, kind: int) -> None:
        self.rows.append(row)
        self.kinds.append(kind)
        self.head_at.append(self._head)
        self.tail_at.append(-1)

    def full(self) -> bool:
        return len(self.rows) >= BATCH_ROWS

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]


@dataclass(frozen=True)
class _Stored:
    file: str
    offset: int
    length: int
    transforms: tuple[str, ...]


def _headers_only(fd: int) -> None:
    """Tell the kernel that ``fd`` is read at scattered offsets, until :func:`_stream` says otherwise.

    Each header read is a few hundred bytes between megabytes of tensor data. With the default
    readahead, every such read on a cold file pulls in the next 128 KiB or more - tensor data
    never looked at, the whole checkpoint over a million chunks - where only the header's own
    page is needed.
    """
    _advise(fd, "POSIX_FADV_RANDOM")


def _stream(fds: list[int]) -> None:
    """Readahead back on: the same descriptors may stream the tensor data next (convert-dcp)."""
    for fd in fds:
        _advise(fd, "POSIX_FADV_NORMAL")


def _advise(fd: int, advice: str) -> None:
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):  # advice only: a file system that takes none reads as before
            os.posix_fadvise(fd, 0, 0, getattr(os, advice))


def _kinds(table: ChunkTable) -> np.ndarray:
    """A number per row, equal for rows whose archives should be alike: same dtype, box size and span length."""
    if table.rows == 0:
        return np.zeros(0, dtype=np.int64)
    dtype_ids = {d: i for i, d in enumerate(sorted(set(table.dtypes)))}
    tensor_dtype = np.asarray([dtype_ids[d] for d in table.dtypes], dtype=np.int64)
    # A hash collision only merges two kinds: their chunks then fail the comparison and are parsed in full.
    return row_hash([tensor_dtype[table.tensor_of_row], table.ndim, table.length, *table.sizes.T]).view(np.int64)
