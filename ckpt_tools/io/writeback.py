"""Start the disk writing while a big file is still being written, not at its fsync.

A checkpoint file is written into the page cache far faster than the disk takes it, and the
kernel only begins writing dirty pages back once they pass a share of memory (10 % of RAM by
default: gigabytes) or grow 30 s old. A save that writes its files and then fsyncs them
therefore does all of its copying first and all of its disk writing after - one after the
other, when they could overlap. Handing each written stretch to the kernel's writeback as
soon as it is complete lets the disk work while the next stretch is serialized, so the
closing fsync only waits for the tail. (``POSIX_FADV_DONTNEED`` on Linux starts
asynchronous writeback of the dirty range; pages of it that are already clean are dropped
from the cache, pages still being written stay. It is advice: where the platform lacks it,
nothing changes but the speed.)

What it gains on a real checkpoint save is measured in docs/benchmarks.md (``bin/bench-save``).
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable
from typing import Any

from ckpt_tools.io import digest

WRITEBACK_EVERY = 32 * 2**20  # bytes written between two writeback starts


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to begin writing ``length`` bytes at ``offset`` of ``fd`` to disk, without waiting."""
    if length > 0 and hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


class WritebackTracker:
    """Counts the bytes written to a sequentially written file; starts writeback every ``every`` bytes."""

    def __init__(self, every: int = WRITEBACK_EVERY) -> None:
        self.position = 0  # file offset written up to
        self.handed_over = 0  # file offset up to which writeback has been started
        self.every = every

    def due(self, written: int) -> bool:
        """Record ``written`` more bytes; True when a stretch of ``every`` bytes awaits writeback."""
        self.position += written
        return self.position - self.handed_over >= self.every

    def hand_over(self, fd: int) -> None:
        """Start writeback of everything written since the last hand-over (it must be in the kernel)."""
        start_writeback(fd, self.handed_over, self.position - self.handed_over)
        self.handed_over = self.position


class WritebackFile(io.BufferedWriter):
    """A new file opened for sequential binary writing that starts writeback as it goes.

    ``on_close(size, digest, seconds)``: the file's full digest (:mod:`ckpt_tools.io.digest`),
    computed from the bytes as they are written, handed over when it is closed with the seconds
    spent computing it - not at all if the writer seeked (the bytes hashed would not be the file's).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        every: int = WRITEBACK_EVERY,
        on_close: Callable[[int, str, float], None] | None = None,
    ) -> None:
        super().__init__(io.FileIO(path, "wb"), buffer_size=2**20)
        self._tracker = WritebackTracker(every=every)
        self._on_close = on_close
        self._hash = digest.hasher() if on_close is not None else None
        self._hashed = 0
        self._hash_s = 0.0

    def write(self, data: Any) -> int:
        if self._hash is not None:
            started = time.perf_counter()
            self._hash.update(data)
            self._hash_s += time.perf_counter() - started
        written = super().write(data)
        self._hashed += written
        if self._tracker.due(written):
            self.flush()  # what is still in our buffer is not the kernel's to write yet
            self._tracker.hand_over(self.fileno())
        return written

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._hash = None  # the bytes in write order may no longer be the file's
        return super().seek(offset, whence)

    def close(self) -> None:
        if not self.closed and self._hash is not None and self._on_close is not None:
            hexdigest, size, report = self._hash.hexdigest(), self._hashed, self._on_close
            self._on_close = None
            super().close()
            report(size, hexdigest, self._hash_s)
            return
        super().close()
