"""Open shard files once, read exact byte ranges from them, close them all at the end."""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Protocol

from ckpt_tools.dcp import transforms
from ckpt_tools.errors import CheckpointError, CorruptCheckpoint
from ckpt_tools.io.remote import Readable, RemoteHandle, as_path, pread, remote_file
from ckpt_tools.io.safe_read import open_regular

UNBOUNDED = 2**62


class Stored(Protocol):
    """Where an item's bytes are: a span of a shard file, perhaps transformed (zstd)."""

    @property
    def file(self) -> str: ...
    @property
    def offset(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def transforms(self) -> tuple[str, ...]: ...


class ShardFiles:
    """A cache of read-only descriptors for the shard files of one DCP directory.

    Paths were validated by :mod:`ckpt_tools.dcp.validate` (inside the directory, no symlink
    escape); ``O_NOFOLLOW`` on the last component keeps a swap-in symlink from slipping through later.
    """

    def __init__(self, root: Path) -> None:
        self.root = as_path(root)
        self._fds: dict[str, int] = {}
        self._undone: dict[tuple[str, int], tuple[IO[bytes], int]] = {}
        self._remote: dict[str, RemoteHandle] = {}

    def span(self, item: Stored, *, limit: int) -> tuple[Readable, int, int]:
        """``(fd, offset, length)`` of ``item``'s original bytes.

        An untransformed item is its span of the shard file; a transformed one (torch's zstd
        extension) is decompressed once, at most ``limit`` bytes, into an anonymous temporary
        file that lives as long as this object.
        """
        if not item.transforms:
            return self.fd(item.file), item.offset, item.length
        key = (item.file, item.offset)
        undone = self._undone.get(key)
        if undone is None:
            tmp = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as this object (closed in close())
            try:
                what = f"{self.root / item.file} at {item.offset}"
                n = transforms.undo(
                    self.fd(item.file), item.offset, item.length, item.transforms, tmp, limit=limit, what=what
                )
            except BaseException:
                tmp.close()
                raise
            undone = self._undone[key] = (tmp, n)
        return undone[0].fileno(), 0, undone[1]

    def data_fd(self, item: Stored) -> Readable:
        """The descriptor a chunk's data offsets (:class:`~ckpt_tools.dcp.reader.ChunkLayout`) refer to.

        Layouts are read through :meth:`span` first, which bounds the decompression; this reuses it.
        """
        return self.span(item, limit=UNBOUNDED)[0]

    def fd(self, relative: str) -> Readable:
        known: int | RemoteHandle | None = self._fds.get(relative)
        if known is None:
            known = self._remote.get(relative)
        if known is not None:
            return known
        path = self.root / relative
        remote = remote_file(path)
        if remote is not None:  # on the Hub: ranged reads of what is asked for, nothing opened
            handle = self._remote[relative] = RemoteHandle(remote)
            return handle
        try:
            fd = open_regular(path, follow_symlinks=False)  # a FIFO swapped in must not block the read
        except OSError as e:
            raise CheckpointError(f"{path}: cannot open ({e.strerror})") from None
        self._fds[relative] = fd
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._remote.clear()
        for tmp, _ in self._undone.values():
            tmp.close()
        self._undone.clear()

    def __enter__(self) -> ShardFiles:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass(frozen=True)
class Listed:
    """One entry of a directory, from a single ``lstat``: what the checks of its shard files need."""

    size: int
    mtime_ns: int
    regular: bool
    symlink: bool


def listing(root: Path) -> dict[str, Listed]:
    """Every entry of ``root`` by name, one ``lstat`` each (empty when ``root`` cannot be read).

    A thousand ranks write four thousand shard files per directory: resolving each path
    component by component (``Path.resolve``) costs more than the rest of a tool's checks.
    A plain name listed here as a regular file, not a symlink, is inside ``root`` by construction.
    """
    out: dict[str, Listed] = {}
    remote = remote_file(root)
    if remote is not None:  # a directory on the Hub: its listing, no request
        children = remote.remote_children() if root.is_dir() else {}
        return {name: Listed(size, 0, True, False) for name, size in children.items() if size is not None}
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                out[entry.name] = Listed(st.st_size, st.st_mtime_ns, stat.S_ISREG(st.st_mode), stat.S_ISLNK(st.st_mode))
    except OSError:
        pass
    return out


def is_inside(root: Path, path: Path) -> bool:
    """Whether ``path``, symlinks resolved, lies under ``root`` (false when it cannot be resolved)."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


def pread_exact(fd: Readable, length: int, offset: int, *, what: str) -> bytes:
    """``length`` bytes at ``offset``, or :class:`CorruptCheckpoint` if the file is shorter."""
    chunks = []
    got = 0
    while got < length:
        data = pread(fd, length - got, offset + got)
        if not data:
            raise CorruptCheckpoint(f"{what}: file ends before the chunk data does (truncated file)")
        chunks.append(data)
        got += len(data)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
