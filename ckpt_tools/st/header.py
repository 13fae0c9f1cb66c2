"""Read and check a safetensors file's header without loading any tensor.

The format: an 8-byte little-endian header length N, N bytes of JSON (``name → {dtype,
shape, data_offsets}`` plus an optional ``__metadata__`` of strings), then the data. We
check what a loader relies on: the header fits in the file, every entry has a known dtype
and a byte range equal to ``prod(shape) × itemsize``, the ranges tile the data section with
no gap or overlap, and the data section ends exactly at the end of the file.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_tools.errors import CheckpointError, CorruptCheckpoint
from ckpt_tools.io.remote import RemoteFile, as_path, remote_file
from ckpt_tools.io.safe_read import open_regular, parse_json
from ckpt_tools.st import dtypes

MAX_HEADER_BYTES = 100 * 2**20  # what the safetensors library itself accepts
MAX_ELEMENTS = 2**64  # the safetensors library computes a tensor's size in 64 bits and refuses an overflow


@dataclass(frozen=True)
class HeaderEntry:
    name: str
    dtype: str  # safetensors code, e.g. "F32"
    shape: tuple[int, ...]
    begin: int  # relative to the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return dtypes.numel(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    entries: dict[str, HeaderEntry]
    metadata: dict[str, str]
    data_start: int  # absolute offset of the data section
    file_size: int
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def healthy(self) -> bool:
        return not self.problems


def read_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Parse the header; structural problems are listed in ``problems``, unreadable files raise."""
    p = as_path(path)
    try:
        remote = remote_file(p)
        if remote is not None:  # on the Hub: the header's two ranges, never the data
            size, raw, n = _remote_header(remote, p)
        else:
            with os.fdopen(open_regular(p), "rb") as f:  # a FIFO or device is refused, not waited on
                size = os.fstat(f.fileno()).st_size
                n = _header_length(f.read(8), size, p)
                raw = f.read(n)
    except FileNotFoundError:
        raise CheckpointError(f"{p}: missing") from None
    except OSError as e:
        raise CheckpointError(f"{p}: unreadable ({e.strerror})") from None
    try:
        doc = parse_json(raw, strict=True)  # what the safetensors library's parser takes
    except ValueError as e:
        raise CorruptCheckpoint(f"{p}: safetensors header is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise CorruptCheckpoint(f"{p}: safetensors header is not a JSON object")
    problems: list[str] = []
    metadata: dict[str, str] = {}
    raw_meta = doc.pop("__metadata__", None)
    if isinstance(raw_meta, dict):
        metadata = {str(k): v for k, v in raw_meta.items() if isinstance(v, str)}
        odd = [k for k, v in raw_meta.items() if not isinstance(v, str)]
        if odd:  # the safetensors library refuses the whole file for one
            problems.append(
                f"__metadata__ value of {_show(odd[0])} is a {type(raw_meta[odd[0]]).__name__}, not a string"
            )
    elif raw_meta is not None:
        problems.append("__metadata__ is not an object of strings")
    entries: dict[str, HeaderEntry] = {}
    for name, info in doc.items():
        entry = _entry(name, info, problems)
        if entry is not None:
            entries[name] = entry
    data_len = size - 8 - n
    problems.extend(_layout_problems(entries.values(), data_len))
    return SafetensorsHeader(p, entries, metadata, 8 + n, size, tuple(f"{p.name}: {m}" for m in problems))


def _header_length(head: bytes, size: int, p: Path) -> int:
    """The header length the first 8 bytes announce, checked against the file's size."""
    if len(head) < 8:
        raise CorruptCheckpoint(f"{p}: {size} bytes, too short for a safetensors file")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise CorruptCheckpoint(f"{p}: header length {n} does not fit in the file ({size} bytes)")
    return int(n)


def _remote_header(remote: RemoteFile, p: Path) -> tuple[int, bytes, int]:
    """Size, header bytes and header length of a file read by ranges: 8 bytes, then exactly the header."""
    size = remote.remote_size()
    n = _header_length(remote.remote_read(0, 8), size, p)
    raw = remote.remote_read(8, n)
    if len(raw) != n:
        raise CorruptCheckpoint(f"{p}: header of {n} bytes announced, {len(raw)} read")
    return size, raw, n


def _entry(name: str, info: object, problems: list[str]) -> HeaderEntry | None:
    if not isinstance(info, dict):
        problems.append(f"{name}: header entry is not an object")
        return None
    code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not (isinstance(shape, list) and all(_is_size(s) for s in shape)):
        problems.append(f"{name}: bad shape {_show(shape)}")  # [Infinity], [-1], [true], "3"
        return None
    if _elements_beyond(shape, MAX_ELEMENTS):
        problems.append(f"{name}: shape {_show(shape)} holds more than 2**64 elements")
        return None
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_size(o) for o in offsets)):
        problems.append(f"{name}: bad data_offsets {_show(offsets)}")
        return None
    begin, end = offsets
    entry = HeaderEntry(name, str(code), tuple(shape), begin, end)
    dtype = dtypes.BY_SAFETENSORS.get(str(code))
    if dtype is None:
        problems.append(f"{name}: unknown dtype {_show(code)}")
    elif dtype.torch_shape(entry.shape) is None:
        problems.append(f"{name}: {code} shape {_show(shape)} does not end in a multiple of {dtype.packed}")
    elif entry.numel // dtype.packed * dtype.itemsize != end - begin:
        expected = entry.numel // dtype.packed * dtype.itemsize
        problems.append(f"{name}: {end - begin} bytes for {dtype.name}{_show(shape)} (expected {expected})")
    return entry


def _is_size(value: object) -> bool:
    """A non-negative integer (JSON ``true`` is not one, although Python's bool is an int)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _elements_beyond(shape: list[int], limit: int) -> bool:
    """Whether ``prod(shape)`` exceeds ``limit``, without computing a product of thousands of big numbers."""
    if 0 in shape:
        return False
    count = 1
    for size in shape:
        count *= size
        if count > limit:
            return True
    return False


def _show(value: object) -> str:
    """A header value for a one-line message: a hostile header may hold megabytes in one field."""
    if isinstance(value, list) and len(value) > 8:
        return f"[{', '.join(map(repr, value[:8]))}, ... ({len(value)} items)]"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _layout_problems(entries: Iterable[Any], data_len: int) -> list[str]:
    ordered = sorted(entries, key=lambda e: (e.begin, e.end))
    problems = []
    pos = 0
    for e in ordered:
        if e.begin != pos:
            problems.append(f"{e.name}: data starts at {e.begin}, expected {pos} (gap or overlap)")
        pos = max(pos, e.end)
    if pos != data_len:
        problems.append(f"data section is {data_len} bytes, the header accounts for {pos}")
    return problems
