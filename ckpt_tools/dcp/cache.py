"""The user's cache of chunk tables derived from checkpoints other tools wrote.

A checkpoint LeRobot, torchtitan or plain ``dcp.save`` wrote has no index of ours: the first
look parses its ``.metadata`` (seconds to tens of seconds at a thousand ranks). The table that
parse yields is kept here, keyed by the file's identity - path, device, inode, size,
modification and change time - so any change to ``.metadata`` (an edit, a new save, a copy)
is a different key and the second look reads the table in a fraction of a second. Next to
each table, the stamps (size, modification time) the shard files had when a tool last checked
every chunk archive: while they are unchanged, the archives need no re-reading.

Where: ``$CKPT_TOOLS_CACHE_DIR``, else ``$XDG_CACHE_HOME/ckpt_tools``, else
``~/.cache/ckpt_tools`` (a ``dcp-index`` folder inside). The folder is the user's own
(mode 0700); one owned by someone else or writable by others is not used. Entries are
written atomically and read through the hardened index reader, like a checkpoint's own index.
The oldest entries go when the folder grows past :data:`MAX_BYTES`. Only tables worth keeping
are stored (``.metadata`` of at least :data:`MIN_METADATA_BYTES`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path

from ckpt_tools.dcp.index_file import Binding, IndexRefused, index_bytes, read_index
from ckpt_tools.dcp.table import ChunkTable
from ckpt_tools.io.safe_read import parse_json

CACHE_DIR_ENV = "CKPT_TOOLS_CACHE_DIR"
MIN_METADATA_BYTES = 256 * 2**10
MAX_BYTES = 4 * 2**30
_SUFFIX = ".index"
_STAMPS = ".stamps"

Identity = tuple[int, int, int, int, int]


def identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def folder() -> Path | None:
    """The cache folder, created if needed; None when there is no safe place for it."""
    base = os.environ.get(CACHE_DIR_ENV)
    if base:
        root = Path(base)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "ckpt_tools"
    path = root / "dcp-index"
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = path.stat()
    except (OSError, RuntimeError):
        return None
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        return None  # someone else could plant a table here
    return path


def _key(metadata: Path, ident: Identity) -> str:
    text = f"{os.path.realpath(metadata)}\0{ident}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def lookup(metadata: Path, ident: Identity) -> ChunkTable | None:
    """The cached table for ``.metadata`` with this identity, if there is a sound one."""
    where = folder()
    if where is None:
        return None
    entry = where / (_key(metadata, ident) + _SUFFIX)
    try:
        data = entry.read_bytes()
    except OSError:
        return None
    try:
        table, binding = read_index(data, what=str(entry))
    except IndexRefused:
        _remove(entry)
        return None
    if binding.identity != list(ident):
        return None
    _touch(entry)
    return table


def store(metadata: Path, ident: Identity, table: ChunkTable) -> None:
    """Keep ``table`` for ``.metadata`` with this identity (silently nothing when the cache is unusable)."""
    if ident[2] < MIN_METADATA_BYTES:
        return
    where = folder()
    if where is None:
        return
    data = index_bytes(table, Binding(metadata_size=ident[2], metadata_sha256=None, identity=list(ident)))
    _write(where / (_key(metadata, ident) + _SUFFIX), data)
    _prune(where)


def checked_stamps(metadata: Path, ident: Identity) -> list[list[int]] | None:
    """The shard files' (size, mtime) when a tool last found every chunk archive sound, if recorded."""
    where = folder()
    if where is None:
        return None
    try:
        data = parse_json((where / (_key(metadata, ident) + _STAMPS)).read_bytes())
    except (OSError, ValueError):
        return None
    ok = type(data) is list and all(type(s) is list and len(s) == 2 and all(type(x) is int for x in s) for s in data)
    return data if ok else None


def remember_checked(metadata: Path, ident: Identity, stamps: list[list[int]]) -> None:
    """Record that every chunk archive was sound while the shard files had ``stamps``."""
    where = folder()
    if where is None or ident[2] < MIN_METADATA_BYTES:
        return
    import json

    _write(where / (_key(metadata, ident) + _STAMPS), json.dumps(stamps).encode("ascii"))


def _write(path: Path, data: bytes) -> None:
    from ckpt_tools.io.fsutil import atomic_write

    try:
        with atomic_write(path) as f:
            f.write(data)
    except OSError:
        pass  # a full disk or a read-only home: the cache is an optimization


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(path)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _prune(where: Path) -> None:
    """Remove the least recently used entries until the folder holds at most MAX_BYTES."""
    try:
        entries = [(p.stat(), p) for p in where.iterdir() if p.name.endswith(_SUFFIX)]
    except OSError:
        return
    total = sum(st.st_size for st, _ in entries)
    for st, path in sorted(entries, key=lambda e: e[0].st_mtime_ns):
        if total <= MAX_BYTES:
            break
        _remove(path)
        _remove(path.with_suffix(_STAMPS))
        total -= st.st_size
