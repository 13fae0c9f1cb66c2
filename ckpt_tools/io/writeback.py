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
from typing import Any

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
    """A new file opened for sequential binary writing that starts writeback as it goes."""

    def __init__(self, path: str | os.PathLike[str], every: int = WRITEBACK_EVERY) -> None:
        super().__init__(io.FileIO(path, "wb"), buffer_size=2**20)
        self._tracker = WritebackTracker(every=every)

    def write(self, data: Any) -> int:
        written = super().write(data)
        if self._tracker.due(written):
            self.flush()  # what is still in our buffer is not the kernel's to write yet
            self._tracker.hand_over(self.fileno())
        return written
