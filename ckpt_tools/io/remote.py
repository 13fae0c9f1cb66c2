"""The seam through which a reader is given a file it cannot ``open()``: one on the Hugging Face Hub.

A reader of small checkpoint files (JSON records, ``.metadata``, a safetensors header, the
listing of a DCP directory) asks :func:`remote_file` about its path first: a path that answers
is read through its own ranged reads - only the bytes the reader asks for - and never through
the local file system; any other path is read as before. The Hub's implementation is
:class:`ckpt_tools.hub.hubpath.HubPath`; nothing in ``ckpt_tools.io`` knows about the Hub.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Protocol, cast


class RemoteFile(Protocol):
    """What a reader needs of a file it reads by ranges: its size and any span of its bytes."""

    def remote_size(self) -> int:
        """The file's size in bytes (``FileNotFoundError`` when there is no such file)."""
        ...

    def remote_read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset``, fewer only at the end of the file."""
        ...

    def remote_children(self) -> dict[str, int | None]:
        """A directory's entries: name -> size of a file, None for a subdirectory."""
        ...


def remote_file(path: object) -> RemoteFile | None:
    """``path`` as a :class:`RemoteFile` when it is one, else None (a local path).

    Decided by the class's ``remote_read``, not ``isinstance`` against the protocol: a
    runtime protocol check walks the class's bases and, on Python 3.11, gives ``pathlib``'s
    classes an ``__annotations__`` attribute - a change to shared classes the restricted
    readers promise never to make - and it costs microseconds on every file a reader opens.
    """
    return cast(RemoteFile, path) if callable(getattr(type(path), "remote_read", None)) else None


def as_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a ``Path``, a remote one kept as it is (``Path(p)`` would make it a local path)."""
    return path if isinstance(path, Path) else Path(path)


def read_remote_whole(file: RemoteFile, limit: int, what: str) -> bytes:
    """The whole of a small remote file of at most ``limit`` bytes (an ``OSError`` when it is larger)."""
    size = file.remote_size()
    if size > limit:
        raise OSError(errno.EFBIG, f"{size} bytes, more than the {limit} such a file can hold", what)
    data = file.remote_read(0, size)
    if len(data) != size:
        raise OSError(errno.EIO, f"read {len(data)} of its {size} bytes", what)
    return data


READ_AHEAD = (
    8 * 1024
)  # a small read of a remote file fetches this much: a chunk archive's zip records come in tiny reads


class RemoteHandle:
    """An open remote file for positioned reads (:func:`pread`), in place of a local descriptor.

    A read smaller than :data:`READ_AHEAD` fetches that much from its offset and keeps it, so
    the dozen reads of one chunk archive's header are one request; a larger read is one
    request of exactly its size (a streamed block of tensor data, never more).
    """

    def __init__(self, file: RemoteFile) -> None:
        self.file = file
        self._window = (0, b"")

    def pread(self, length: int, offset: int) -> bytes:
        base, data = self._window
        if base <= offset and offset + length <= base + len(data):
            return data[offset - base : offset - base + length]
        if length >= READ_AHEAD:
            return self.file.remote_read(offset, length)
        data = self.file.remote_read(offset, READ_AHEAD)
        self._window = (offset, data)
        return data[:length]


Readable = int | RemoteHandle  # what the readers read from: a local descriptor or a file on the Hub


def pread(fd: Readable, length: int, offset: int) -> bytes:
    """``os.pread`` for a local descriptor or a :class:`RemoteHandle`: what the chunk readers call."""
    return os.pread(fd, length, offset) if isinstance(fd, int) else fd.pread(length, offset)
