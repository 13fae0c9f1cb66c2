"""Open shard files once, read exact byte ranges from them, close them all at the end."""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

from ckpt_tools.errors import CheckpointError, CorruptCheckpoint


class ShardFiles:
    """A cache of read-only descriptors for the shard files of one DCP directory.

    Paths were validated by :mod:`ckpt_tools.dcp.validate` (inside the directory, no symlink
    escape); ``O_NOFOLLOW`` on the last component keeps a swap-in symlink from slipping through later.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._fds: dict[str, int] = {}

    def fd(self, relative: str) -> int:
        fd = self._fds.get(relative)
        if fd is None:
            path = self.root / relative
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
            except OSError as e:
                raise CheckpointError(f"{path}: cannot open ({e.strerror})") from None
            self._fds[relative] = fd
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> ShardFiles:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def is_inside(root: Path, path: Path) -> bool:
    """Whether ``path``, symlinks resolved, lies under ``root`` (false when it cannot be resolved)."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


def pread_exact(fd: int, length: int, offset: int, *, what: str) -> bytes:
    """``length`` bytes at ``offset``, or :class:`CorruptCheckpoint` if the file is shorter."""
    chunks = []
    got = 0
    while got < length:
        data = os.pread(fd, length - got, offset + got)
        if not data:
            raise CorruptCheckpoint(f"{what}: file ends before the chunk data does (truncated file)")
        chunks.append(data)
        got += len(data)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
