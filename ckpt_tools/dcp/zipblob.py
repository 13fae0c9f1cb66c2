"""Find the members of a ``torch.save`` zip archive that sits inside a span of a larger file.

Each DCP chunk is a complete torch.save archive (stored, uncompressed) written at some
offset of a ``.distcp`` file; the zip offsets inside it are relative to the span's start.
We read the end-of-central-directory record at the end of the span, then the central
directory, because torch's local headers carry zero sizes (streamed with a data
descriptor). Members larger than 4 GiB use zip64 extras, which we follow. Only the few
hundred bytes of headers are read; member data is left where it is for the caller to copy.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ckpt_tools.errors import CorruptCheckpoint
from ckpt_tools.io.remote import Readable, pread

_EOCD_SIG = b"PK\x05\x06"
_ZIP64_LOCATOR_SIG = b"PK\x06\x07"
_ZIP64_EOCD_SIG = b"PK\x06\x06"
_CENTRAL_SIG = b"PK\x01\x02"
_LOCAL_SIG = b"PK\x03\x04"
_EOCD_SIZE = 22
# Central directory file header, the fields we use: signature, method, sizes, name/extra/comment
# lengths, local header offset (the skipped ones: versions, flags, time, date, crc, disk, attributes).
_CENTRAL = struct.Struct("<4s6xH8xIIHHH8xI")
_MAX_COMMENT = 0xFFFF
_MAX_ENTRIES = 4096  # a torch.save archive holds a handful of records plus one per storage
_MAX_CENTRAL_BYTES = 4 * 2**20
_HEAD_WINDOW = 4096  # data.pkl and byteorder sit at the start of the archive
_TAIL_WINDOW = 4096  # the central directory of a tensor archive is ~700 bytes


@dataclass(frozen=True)
class Member:
    """A stored zip member: ``offset`` (of its data, relative to the span start) and ``size``."""

    name: str
    offset: int
    size: int


class SpanReader:
    """Positioned reads confined to ``[start, start+length)`` of an open file, with two cached windows."""

    def __init__(self, fd: Readable, start: int, length: int, what: str) -> None:
        self.fd = fd
        self.start = start
        self.length = length
        self.what = what
        self._windows: list[tuple[int, bytes]] = []

    def read(self, rel: int, n: int) -> bytes:
        if rel < 0 or n < 0 or rel + n > self.length:
            raise CorruptCheckpoint(f"{self.what}: zip structure points outside its span")
        for base, data in self._windows:
            if base <= rel and rel + n <= base + len(data):
                return data[rel - base : rel - base + n]
        data = pread(self.fd, n, self.start + rel)
        if len(data) != n:
            raise CorruptCheckpoint(f"{self.what}: file is truncated (chunk span past end of file)")
        return data

    def prefetch(self, rel: int, n: int) -> None:
        n = max(0, min(n, self.length - rel))
        data = pread(self.fd, n, self.start + rel)
        if len(data) != n:
            raise CorruptCheckpoint(f"{self.what}: file is truncated (chunk span past end of file)")
        self._windows.append((rel, data))


class ZipDirectory:
    """The central directory of the archive in a span; member data offsets resolved on demand.

    Resolving a member needs its local header (its extra field length differs from the
    central one: torch pads data to 64 bytes there), so only the members a caller asks for
    are resolved - usually from the cached head window, without another read.
    """

    def __init__(
        self,
        span: SpanReader,
        entries: dict[str, tuple[str, int, int]],
        data_end: int,
        central: list[int] | None = None,
    ) -> None:
        self.span = span
        self._entries = entries  # short name -> (full name, local header offset, size)
        self._data_end = data_end
        self.central = central or []  # offsets (in the span) of the central directory's entries

    def crc_fields(self) -> list[int]:
        """Span offsets of every CRC-32 field (4 bytes) in the local and central headers: never read here."""
        return [lho + 14 for _, lho, _ in self._entries.values()] + [pos + 16 for pos in self.central]

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return list(self._entries)

    def member(self, name: str) -> Member | None:
        found = self._entries.get(name)
        if found is None:
            return None
        full, lho, size = found
        local = self.span.read(lho, 30)
        if local[:4] != _LOCAL_SIG:
            raise CorruptCheckpoint(f"{self.span.what}: zip member {full} has no local header where the directory says")
        local_nlen, local_elen = struct.unpack_from("<HH", local, 26)
        data_offset = lho + 30 + local_nlen + local_elen
        if data_offset + size > self._data_end:
            raise CorruptCheckpoint(f"{self.span.what}: zip member {full} runs past the archive's data")
        return Member(name, data_offset, size)


def read_directory(span: SpanReader) -> ZipDirectory:
    """The archive's members, keyed by name with the archive prefix removed.

    ``archive/data.pkl`` → ``data.pkl``; ``archive/data/0`` → ``data/0``.
    """
    what = span.what
    if span.length < _EOCD_SIZE:
        raise CorruptCheckpoint(f"{what}: chunk of {span.length} bytes is too small to be a torch.save archive")
    span.prefetch(0, min(_HEAD_WINDOW, span.length))
    if span.read(0, 4) != _LOCAL_SIG:
        raise CorruptCheckpoint(
            f"{what}: chunk is not a torch.save zip archive (other DCP serialization formats are not supported)"
        )
    tail_len = min(_TAIL_WINDOW, span.length)
    if span.length > _HEAD_WINDOW:
        span.prefetch(span.length - tail_len, tail_len)
    eocd = _find_eocd(span)
    count, cd_size, cd_offset = _central_directory_location(span, eocd)
    if count > _MAX_ENTRIES or cd_size > _MAX_CENTRAL_BYTES or cd_offset + cd_size > eocd:
        raise CorruptCheckpoint(f"{what}: implausible zip central directory")
    central = span.read(cd_offset, cd_size)
    entries: dict[str, tuple[str, int, int]] = {}
    central_at: list[int] = []
    pos = 0
    for _ in range(count):
        if pos + 46 > len(central):
            raise CorruptCheckpoint(f"{what}: damaged zip central directory")
        sig, method, csize, usize, nlen, elen, clen, lho = _CENTRAL.unpack_from(central, pos)
        if sig != _CENTRAL_SIG:
            raise CorruptCheckpoint(f"{what}: damaged zip central directory")
        central_at.append(cd_offset + pos)
        name = central[pos + 46 : pos + 46 + nlen].decode("utf-8", errors="replace")
        if 0xFFFFFFFF in (usize, csize, lho):
            extra = central[pos + 46 + nlen : pos + 46 + nlen + elen]
            usize, csize, lho = _apply_zip64(extra, usize, csize, lho, what)
        pos += 46 + nlen + elen + clen
        if lho + 30 > cd_offset:  # every local header lies before the central directory
            raise CorruptCheckpoint(f"{what}: zip member {name} has its local header outside the archive's data")
        if method != 0 or csize != usize:
            raise CorruptCheckpoint(f"{what}: zip member {name} is compressed (torch.save never compresses)")
        short = name.split("/", 1)[1] if "/" in name else name
        entries[short] = (name, lho, usize)
    return ZipDirectory(span, entries, cd_offset, central_at)


def _find_eocd(span: SpanReader) -> int:
    search = min(span.length, _EOCD_SIZE + _MAX_COMMENT)
    tail = span.read(span.length - min(search, _TAIL_WINDOW), min(search, _TAIL_WINDOW))
    idx = tail.rfind(_EOCD_SIG)
    if idx < 0 and search > _TAIL_WINDOW:
        tail = span.read(span.length - search, search)
        idx = tail.rfind(_EOCD_SIG)
    if idx < 0 or len(tail) - idx < _EOCD_SIZE:
        raise CorruptCheckpoint(f"{span.what}: no zip end record in the chunk span (truncated or wrong offset)")
    return span.length - len(tail) + idx


def _central_directory_location(span: SpanReader, eocd: int) -> tuple[int, int, int]:
    rec = span.read(eocd, _EOCD_SIZE)
    entries, cd_size, cd_offset = struct.unpack_from("<HII", rec, 10)
    if entries == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        if eocd < 20:
            raise CorruptCheckpoint(f"{span.what}: zip64 archive without its locator")
        locator = span.read(eocd - 20, 20)
        if locator[:4] != _ZIP64_LOCATOR_SIG:
            raise CorruptCheckpoint(f"{span.what}: zip64 archive without its locator")
        (z64_offset,) = struct.unpack_from("<Q", locator, 8)
        z64 = span.read(z64_offset, 56)
        if z64[:4] != _ZIP64_EOCD_SIG:
            raise CorruptCheckpoint(f"{span.what}: damaged zip64 end record")
        entries, cd_size, cd_offset = struct.unpack_from("<QQQ", z64, 32)
    return entries, cd_size, cd_offset


def _apply_zip64(extra: bytes, usize: int, csize: int, lho: int, what: str) -> tuple[int, int, int]:
    if 0xFFFFFFFF not in (usize, csize, lho):
        return usize, csize, lho
    pos = 0
    while pos + 4 <= len(extra):
        header_id, size = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4 : pos + 4 + size]
        pos += 4 + size
        if header_id != 0x0001:
            continue
        values = [struct.unpack_from("<Q", body, i)[0] for i in range(0, len(body) - 7, 8)]
        try:
            if usize == 0xFFFFFFFF:
                usize = values.pop(0)
            if csize == 0xFFFFFFFF:
                csize = values.pop(0)
            if lho == 0xFFFFFFFF:
                lho = values.pop(0)
        except IndexError:
            break
        return usize, csize, lho
    raise CorruptCheckpoint(f"{what}: zip member needs a zip64 extra field that is missing")
