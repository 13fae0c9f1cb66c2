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
from typing import NamedTuple

import numpy as np

from ckpt_tools.dcp.files import ShardFiles
from ckpt_tools.dcp.reader import ArchiveShape, ChunkLayout, read_chunk_archive
from ckpt_tools.dcp.table import ChunkTable, row_hash
from ckpt_tools.errors import CorruptCheckpoint
from ckpt_tools.st import dtypes

ARCHIVE_SLACK = 1 * 2**20  # what a transformed (zstd) span may expand to beyond its tensor bytes
SMALL_SPAN = 16 * 2**10  # a span this short is read in one call


@dataclass
class _Template:
    shape: ArchiveShape
    mask: int  # 1 bits where a header byte must equal the template's
    expected: int  # the template's header bytes, masked
    length: int
    layout: ChunkLayout  # with data_offset relative to the span's start

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
    return _Template(shape, mask, int.from_bytes(raw, "little") & mask, length, relative)


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
        pending: _Pending | None = None  # a row whose head was read, whose tail is still to read
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
                pending = self._finish(pending)
                self.layout(i, int(tensor_of[i]))
                continue
            head_end = start + template.shape.data_start
            fd = self.files.fd(tb.files[f])
            if f != advised:
                _headers_only(fd)
                advised = f
                advised_fds.append(fd)
            if pending is not None and pending.file == f and pending.end == start:
                joined = os.pread(fd, head_end - pending.tail_start, pending.tail_start)
                cut = pending.end - pending.tail_start
                self._judge(pending, joined[:cut])
                head = joined[cut:]
            else:
                pending = self._finish(pending)
                head = os.pread(fd, head_end - start, start)
            pending = _Pending(i, f, fd, head, start + template.shape.data_end, start + length, template)
        self._finish(pending)

    def _finish(self, pending: _Pending | None) -> None:
        """Read the tail of ``pending`` on its own and judge it (None: nothing to do)."""
        if pending is not None:
            self._judge(pending, os.pread(pending.fd, pending.end - pending.tail_start, pending.tail_start))
        return None

    def _judge(self, row: _Pending, tail: bytes) -> None:
        """Header bytes equal to the template's (masked): sound; else the full parse decides."""
        template = row.template
        raw = row.head + tail
        if len(raw) == template.shape.data_start + template.length - template.shape.data_end and (
            int.from_bytes(raw, "little") & template.mask == template.expected
        ):
            return
        self.parse(row.row, int(self.table.tensor_of_row[row.row]))

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


class _Pending(NamedTuple):
    """A chunk whose head was read and whose tail is still to read (a tuple: one is made per chunk)."""

    row: int
    file: int
    fd: int
    head: bytes
    tail_start: int  # absolute offsets in the file
    end: int
    template: _Template


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
