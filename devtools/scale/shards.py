"""Sparse shard files: every archive's bytes in place, the tensor data left as holes.

A hole reads as zeros, which is exactly the data the archive templates were made from
(:mod:`devtools.scale.archives`), so each chunk reads back as a valid torch.save archive of a
zero tensor - while a 70B checkpoint costs a few KiB of disk per chunk instead of its size.
Bytes separated by less than a page are written together (zeros included: the page holds
them anyway), so a file takes a few large writes rather than two per chunk.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from devtools.scale.archives import ArchiveTemplate

PAGE = 4096


def write_sparse(path: Path, archives: Iterable[ArchiveTemplate]) -> int:
    """Write ``archives`` back to back into a new ``path``; returns the file's length."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        start, buffer, position = 0, bytearray(), 0
        for archive in archives:
            buffer += archive.head
            if archive.data >= PAGE:
                _flush(fd, buffer, start)
                start = position + len(archive.head) + archive.data
                buffer = bytearray()
            else:
                buffer += bytes(archive.data)
            buffer += archive.tail
            position += archive.length
        _flush(fd, buffer, start)
        os.ftruncate(fd, position)
    finally:
        os.close(fd)
    return position


def _flush(fd: int, buffer: bytearray, offset: int) -> None:
    view = memoryview(buffer)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
