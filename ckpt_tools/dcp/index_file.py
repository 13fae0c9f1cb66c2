"""The chunk table as a file: what the training core writes beside ``.metadata`` and what the cache keeps.

Layout (little-endian)::

    b"CKPTIDX1" | u64 header length | header (JSON, UTF-8) | zero padding to 8 | columns | sha256 of all before

The header holds the per-tensor lists, the file and transform names, where each column lies
and in which integer width, and a *binding*: what the table was derived from (the save's
``.metadata``, by size and SHA-256; a cache entry adds the file's identity) and, per shard
file, the size and modification time it had when its chunk archives were known good
(``stamps``: written by this save, or checked by a tool). Columns are stored in the narrowest
signed width that holds them and widened to int64 on reading.

The file is input like any other checkpoint file: :func:`read_index` checks the digest, the
JSON, every list's types and every column's range before a table is handed out, so an edited,
truncated or hostile index is refused in one line - and the callers then read ``.metadata``
instead (:mod:`ckpt_tools.dcp.index`), never trusting a table that does not check out.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckpt_tools.dcp.table import MAX_DIM, MAX_NAME, MAX_NDIM, MAX_OFFSET, ByteItem, ChunkTable
from ckpt_tools.errors import CorruptCheckpoint
from ckpt_tools.io.safe_read import parse_json
from ckpt_tools.st import dtypes

MAGIC = b"CKPTIDX1"
FORMAT = 1
_DIGEST = 32
_MAX_HEADER = 1 << 30
_WIDTHS: dict[str, type[np.signedinteger[Any]]] = {"i1": np.int8, "i2": np.int16, "i4": np.int32, "i8": np.int64}
_COLUMNS = ("first", "ndim", "offsets", "sizes", "file", "start", "length", "transform")
_KNOWN_DTYPES = frozenset(dtypes.canonical_name(n) for n in dtypes.TORCH_DTYPE_NAMES)


@dataclass
class Binding:
    """What a table was derived from, and when its shard files were last known good."""

    metadata_size: int
    metadata_sha256: str | None  # None in a cache entry, which is keyed by identity instead
    identity: list[int] | None = None  # cache: (dev, inode, size, mtime_ns, ctime_ns) of .metadata
    stamps: list[list[int]] | None = None  # per table.files entry: [size, mtime_ns]; None: not known
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "metadata_size": self.metadata_size,
            "metadata_sha256": self.metadata_sha256,
            "identity": self.identity,
            "stamps": self.stamps,
            "extra": self.extra,
        }


# ====================================================================== writing


def index_bytes(table: ChunkTable, binding: Binding) -> bytes:
    """The file content for ``table`` bound to ``binding``."""
    blobs: list[bytes] = []
    columns: dict[str, list[Any]] = {}
    pos = 0
    for name in _COLUMNS:
        array = np.ascontiguousarray(getattr(table, name), dtype=np.int64)
        code = _narrowest(array)
        data = array.astype(_WIDTHS[code]).astype(f"<{code}", copy=False).tobytes()
        columns[name] = [pos, len(data), code, list(array.shape)]
        pad = (-len(data)) % 8
        blobs.append(data + b"\0" * pad)
        pos += len(data) + pad
    header = {
        "format": FORMAT,
        "binding": binding.to_json(),
        "names": table.names,
        "dtypes": table.dtypes,
        "shapes": [list(s) for s in table.shapes],
        "paths": [list(p) for p in table.paths],
        "files": table.files,
        "transforms": [list(t) for t in table.transforms],
        "byte_items": [[b.name, list(b.path), b.file, b.start, b.length, list(b.transforms)] for b in table.byte_items],
        "checkpoint_id": table.checkpoint_id,
        "version": table.version,
        "modules": list(table.modules),
        "save_id": table.save_id,
        "rank_local": list(table.rank_local),
        "width": table.width,
        "columns": columns,
    }
    text = json.dumps(header, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    text += b" " * ((-len(text)) % 8)
    body = b"".join([MAGIC, struct.pack("<Q", len(text)), text, *blobs])
    return body + hashlib.sha256(body).digest()


def _narrowest(array: np.ndarray) -> str:
    if array.size == 0:
        return "i1"
    lo, hi = int(array.min()), int(array.max())
    for code in ("i1", "i2", "i4"):
        info = np.iinfo(_WIDTHS[code])
        if info.min <= lo and hi <= info.max:
            return code
    return "i8"


def write_index(path: str | os.PathLike[str], table: ChunkTable, binding: Binding) -> None:
    """Write the index atomically (a temporary sibling, fsynced, renamed)."""
    from pathlib import Path

    from ckpt_tools.io.fsutil import atomic_write

    with atomic_write(Path(path)) as f:
        f.write(index_bytes(table, binding))


def file_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a regular file, streamed: a 400 MB ``.metadata`` is never held in memory."""
    from ckpt_tools.io.remote import RemoteHandle, pread, remote_file
    from ckpt_tools.io.safe_read import open_regular

    remote = remote_file(path)
    fd: int | RemoteHandle = RemoteHandle(remote) if remote is not None else open_regular(path)  # Hub: by ranges
    try:
        digest = hashlib.sha256()
        offset = 0
        while True:
            block = pread(fd, 16 << 20, offset)
            if not block:
                return digest.hexdigest()
            digest.update(block)
            offset += len(block)
    finally:
        if isinstance(fd, int):
            os.close(fd)


# ====================================================================== reading


class IndexRefused(CorruptCheckpoint):
    """An index file that is not a sound, intact index (the caller falls back to ``.metadata``)."""


def read_index(data: bytes, *, what: str) -> tuple[ChunkTable, Binding]:
    """The table and binding in ``data``; :class:`IndexRefused` for anything that does not check out."""
    try:
        return _read(memoryview(data), what)
    except IndexRefused:
        raise
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, struct.error) as e:
        raise IndexRefused(f"{what}: not a sound chunk index ({str(e)[:200] or type(e).__name__})") from None


def _refuse(what: str, why: str) -> IndexRefused:
    return IndexRefused(f"{what}: not a sound chunk index ({why})")


def _read(data: memoryview, what: str) -> tuple[ChunkTable, Binding]:
    if len(data) < len(MAGIC) + 8 + _DIGEST or bytes(data[: len(MAGIC)]) != MAGIC:
        raise _refuse(what, "no index signature")
    body, digest = data[:-_DIGEST], bytes(data[-_DIGEST:])
    if hashlib.sha256(body).digest() != digest:
        raise _refuse(what, "its digest does not match: truncated or changed")
    (header_len,) = struct.unpack_from("<Q", body, len(MAGIC))
    start = len(MAGIC) + 8
    if header_len > min(_MAX_HEADER, len(body) - start):
        raise _refuse(what, "header length past the end")
    header = parse_json(bytes(body[start : start + header_len]))
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _refuse(what, "unknown format version")
    blobs = body[start + header_len :]
    names = _strings(header["names"], "names")
    if len(set(names)) != len(names):
        raise _refuse(what, "a tensor listed twice")
    t = len(names)
    dtype_names = _strings(header["dtypes"], "dtypes")
    if len(dtype_names) != t or not set(dtype_names) <= _KNOWN_DTYPES:
        raise _refuse(what, "tensor dtypes")
    shapes = [_shape(s) for s in _list(header["shapes"])]
    paths = [_path(p) for p in _list(header["paths"])]
    files = _strings(header["files"], "files")
    transforms = [tuple(_strings(x, "transforms")) for x in _list(header["transforms"])]
    if len(shapes) != t or len(paths) != t or not transforms or transforms[0] != ():
        raise _refuse(what, "per-tensor lists of different lengths")
    width = header["width"]
    if type(width) is not int or not 1 <= width <= MAX_NDIM:
        raise _refuse(what, "column width")
    cols = {name: _column(blobs, header["columns"][name], name) for name in _COLUMNS}
    rows = int(cols["ndim"].shape[0])
    first = cols["first"]
    shapes_ok = (
        first.shape == (t + 1,)
        and all(cols[c].shape == (rows,) for c in ("ndim", "file", "start", "length", "transform"))
        and cols["offsets"].shape == (rows, width)
        and cols["sizes"].shape == (rows, width)
    )
    if not shapes_ok:
        raise _refuse(what, "column shapes")
    if t + 1 and (first[0] != 0 or first[-1] != rows or np.any(np.diff(first) < 0)):
        raise _refuse(what, "tensor row ranges")
    checks = (
        ("ndim", -1 - MAX_NDIM, MAX_NDIM),
        ("offsets", 0, MAX_DIM),
        ("sizes", 0, MAX_DIM),
        ("file", -1, len(files) - 1),
        ("start", 0, MAX_OFFSET),
        ("length", 0, MAX_OFFSET),
        ("transform", 0, len(transforms) - 1),
    )
    for name, lo, hi in checks:
        column = cols[name]
        if column.size and (int(column.min()) < lo or int(column.max()) > hi):
            raise _refuse(what, f"{name} out of range")
    byte_items = [_byte_item(x, files, what) for x in _list(header["byte_items"])]
    binding = _binding(header["binding"], len(files), what)
    table = ChunkTable(
        names=names,
        dtypes=dtype_names,
        shapes=shapes,
        paths=paths,
        first=first,
        ndim=cols["ndim"],
        offsets=cols["offsets"],
        sizes=cols["sizes"],
        file=cols["file"],
        start=cols["start"],
        length=cols["length"],
        transform=cols["transform"],
        files=files,
        transforms=transforms,
        byte_items=byte_items,
        checkpoint_id=_optional_string(header.get("checkpoint_id")),
        version=_optional_string(header.get("version")),
        modules=tuple(_strings(header.get("modules", []), "modules")),
        save_id=_optional_string(header.get("save_id")),
        rank_local=tuple(_strings(header.get("rank_local", []), "rank_local")),
    )
    return table, binding


def _list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise ValueError("expected a list")
    return value


def _strings(value: Any, what: str) -> list[str]:
    items = _list(value)
    if not all(type(x) is str and len(x) <= MAX_NAME for x in items):
        raise ValueError(f"{what}: expected names")
    return items


def _optional_string(value: Any) -> str | None:
    return value if type(value) is str and len(value) <= MAX_NAME else None


def _shape(value: Any) -> tuple[int, ...]:
    items = _list(value)
    if len(items) > MAX_NDIM or not all(type(x) is int and 0 <= x <= MAX_DIM for x in items):
        raise ValueError("a tensor shape")
    return tuple(items)


def _path(value: Any) -> tuple[str | int, ...]:
    items = _list(value)
    if not all((type(x) is str and len(x) <= MAX_NAME) or (type(x) is int and abs(x) <= MAX_OFFSET) for x in items):
        raise ValueError("a planner path")
    return tuple(items)


def _column(blobs: memoryview, spec: Any, name: str) -> np.ndarray:
    pos, nbytes, code, shape = _list(spec)
    if code not in _WIDTHS or type(pos) is not int or type(nbytes) is not int or pos < 0 or nbytes < 0:
        raise ValueError(f"column {name}")
    dims = [int(d) for d in _list(shape) if type(d) is int and d >= 0]
    if len(dims) != len(shape) or len(dims) not in (1, 2):
        raise ValueError(f"column {name} shape")
    itemsize = np.dtype(_WIDTHS[code]).itemsize
    count = 1
    for d in dims:
        count *= d
    if count * itemsize != nbytes or pos + nbytes > len(blobs):
        raise ValueError(f"column {name} extent")
    raw = np.frombuffer(blobs[pos : pos + nbytes], dtype=f"<{code}")
    return raw.astype(np.int64).reshape(dims)


def _byte_item(value: Any, files: list[str], what: str) -> ByteItem:
    name, path, file, start, length, transforms = _list(value)
    if type(name) is not str or len(name) > MAX_NAME or (file is not None and file not in files):
        raise _refuse(what, "a byte item")
    if not all(type(x) is int and 0 <= x <= MAX_OFFSET for x in (start, length)):
        raise _refuse(what, "a byte item span")
    return ByteItem(name, _path(path), file, start, length, tuple(_strings(transforms, "transforms")))


def _binding(value: Any, files: int, what: str) -> Binding:
    if not isinstance(value, dict):
        raise _refuse(what, "binding")
    size, digest = value.get("metadata_size"), value.get("metadata_sha256")
    identity, stamps = value.get("identity"), value.get("stamps")
    if type(size) is not int or size < 0 or not (digest is None or (type(digest) is str and len(digest) == 64)):
        raise _refuse(what, "binding")
    if identity is not None and not (type(identity) is list and all(type(x) is int for x in identity)):
        raise _refuse(what, "binding identity")
    if stamps is not None:
        ok = (
            type(stamps) is list
            and len(stamps) == files
            and all(type(s) is list and len(s) == 2 and all(type(x) is int for x in s) for s in stamps)
        )
        if not ok:
            raise _refuse(what, "file stamps")
    given = value.get("extra")
    extra: dict[str, Any] = given if isinstance(given, dict) else {}
    return Binding(size, digest, identity, stamps, extra)
