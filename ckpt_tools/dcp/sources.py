"""Where a DCP directory's chunk table comes from: the save's index, the cache, or ``.metadata`` itself.

In order:

1. ``.metadata.index``, written by the training core at every save. It is used only when it
   is sound and bound to this very ``.metadata`` (same size and SHA-256): an index left from
   another save, copied from elsewhere or edited is refused, and says so (:attr:`Origin.note`).
2. The user's cache (:mod:`ckpt_tools.dcp.cache`), for checkpoints other tools wrote, keyed by
   the identity of ``.metadata``.
3. ``.metadata`` parsed (:mod:`ckpt_tools.dcp.metadata`), and the table kept in the cache.

Whatever the source, the table is the same (tests check it): the index and the cache are
derived from ``.metadata`` by the same conversion. :func:`reading` turns the first two off
for one block of code (``--no-cache``); :data:`NO_CACHE_ENV` for a whole process.

With the table comes what is known about the shard files' chunk archives: the (size,
modification time) each file had when its archives were known good - written by this save
(the index), or checked by an earlier look (the cache). :meth:`Origin.archives_known_good`
compares those with the files now, one ``stat`` per shard file.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ckpt_tools.dcp import cache
from ckpt_tools.dcp.files import is_inside, listing
from ckpt_tools.dcp.index_file import IndexRefused, file_digest, read_index
from ckpt_tools.dcp.metadata import MAX_METADATA_BYTES, load_metadata
from ckpt_tools.dcp.table import ChunkTable
from ckpt_tools.errors import UnsafeCheckpoint
from ckpt_tools.format.layout import DCP_INDEX, DCP_METADATA
from ckpt_tools.io.remote import read_remote_whole, remote_file
from ckpt_tools.io.safe_read import open_regular

NO_CACHE_ENV = "CKPT_TOOLS_NO_CACHE"
INDEX_PER_METADATA_BYTE = 4  # an index is smaller than its .metadata; this bounds what is read

_use_index: contextvars.ContextVar[bool] = contextvars.ContextVar("use_index", default=True)
_use_cache: contextvars.ContextVar[bool] = contextvars.ContextVar("use_cache", default=True)


@contextlib.contextmanager
def reading(*, index: bool = True, cache: bool = True) -> Iterator[None]:
    """Within the block, read (or not) the save's index and the user's cache."""
    tokens = (_use_index.set(index), _use_cache.set(cache))
    try:
        yield
    finally:
        _use_index.reset(tokens[0])
        _use_cache.reset(tokens[1])


def _enabled(var: contextvars.ContextVar[bool]) -> bool:
    return var.get() and os.environ.get(NO_CACHE_ENV, "") in ("", "0")


Stamps = list[list[int]]


@dataclass
class Origin:
    """Where a table came from and what is known about its shard files."""

    source: str  # "index" (the save's), "cache", "metadata" (parsed now), "rank-local"
    metadata: Path | None = None
    identity: cache.Identity | None = None
    known_good: list[Stamps] = field(default_factory=list)  # stamps at which the archives were sound
    note: str | None = None  # an index that was there but refused, and why

    def archives_known_good(self, root: Path, files: list[str]) -> bool:
        """Whether every shard file is as it was when its chunk archives were known to be sound."""
        if not self.known_good or not files:
            return False
        now = current_stamps(root, files)
        return now is not None and any(stamps == now for stamps in self.known_good)

    def remember_checked(self, root: Path, files: list[str]) -> None:
        """A tool just checked every chunk archive and found them sound: keep the files' stamps."""
        now = current_stamps(root, files)
        if now is None:
            return
        self.known_good.append(now)
        if (
            self.metadata is not None
            and self.identity is not None
            and _enabled(_use_cache)
            and remote_file(self.metadata) is None
        ):
            cache.remember_checked(self.metadata, self.identity, now)


def current_stamps(root: Path, files: list[str]) -> Stamps | None:
    """[size, mtime_ns] of each file (None when one is not a plain file of ``root``: a symlink, a
    subdirectory's file, missing - whose archives are then always read)."""
    listed = listing(root)
    out = []
    for name in files:
        entry = listed.get(name)
        if entry is None or entry.symlink or not entry.regular:
            return None
        out.append([entry.size, entry.mtime_ns])
    return out


def load_table(root: Path) -> tuple[ChunkTable, Origin]:
    """The chunk table of DCP directory ``root`` and where it came from (raises ``CheckpointError``)."""
    path = root / DCP_METADATA
    if not path.exists() and not path.is_symlink():
        return load_metadata(root), Origin("rank-local")
    if path.is_symlink() and not is_inside(root, path):
        raise UnsafeCheckpoint(f"{path}: symlink leads outside the checkpoint directory")
    try:
        st = path.stat()
    except OSError:
        return load_metadata(root), Origin("metadata")  # it reports why
    ident = cache.identity(st)
    # The cache knows a file by its inode and time: a file on the Hub has neither, so it is never cached.
    use_cache = _enabled(_use_cache) and remote_file(root) is None
    note = None
    if _enabled(_use_index) and st.st_size <= MAX_METADATA_BYTES:
        found, note = _saved_index(root, path, st.st_size)
        if found is not None:
            table, stamps = found
            known = [stamps] if stamps is not None else []
            checked = cache.checked_stamps(path, ident) if use_cache else None
            if checked is not None:
                known.append(checked)
            return table, Origin("index", path, ident, known)
    if use_cache:
        cached = cache.lookup(path, ident)
        if cached is not None:
            checked = cache.checked_stamps(path, ident)
            return cached, Origin("cache", path, ident, [checked] if checked else [], note)
    table = load_metadata(root)
    if use_cache:
        cache.store(path, ident, table)
    return table, Origin("metadata", path, ident, [], note)


def _saved_index(root: Path, metadata: Path, size: int) -> tuple[tuple[ChunkTable, Stamps | None] | None, str | None]:
    """The save's index when sound and bound to this ``.metadata``; else None and why (None: no index)."""
    index = root / DCP_INDEX
    if not index.exists() and not index.is_symlink():
        return None, None
    what = f"{index}"
    try:
        if index.is_symlink() and not is_inside(root, index):
            return None, f"{what}: a symlink out of the directory, ignored"
        data = _read_bounded(index, INDEX_PER_METADATA_BYTE * size + (16 << 20))
        table, binding = read_index(data, what=what)
    except IndexRefused as e:
        return None, f"{e}; read .metadata instead"
    except OSError as e:
        return None, f"{what}: unreadable ({e.strerror or e}); read .metadata instead"
    if binding.metadata_size != size or binding.metadata_sha256 is None:
        return None, f"{what}: describes another .metadata (stale or from another save); read .metadata instead"
    try:
        digest = file_digest(metadata)
    except OSError:
        return None, None  # .metadata itself is reported by its parse
    if digest != binding.metadata_sha256:
        return None, f"{what}: describes another .metadata (stale or from another save); read .metadata instead"
    return (table, binding.stamps), None


def _read_bounded(path: Path, limit: int) -> bytes:
    remote = remote_file(path)
    if remote is not None:  # on the Hub: read whole by ranges (it is small)
        return read_remote_whole(remote, limit, str(path))
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise OSError(27, f"{size} bytes, more than such a file can hold")
        chunks, got = [], 0
        while got < size:
            data = os.pread(fd, min(1 << 24, size - got), got)
            if not data:
                break
            chunks.append(data)
            got += len(data)
        return b"".join(chunks)
    finally:
        os.close(fd)
