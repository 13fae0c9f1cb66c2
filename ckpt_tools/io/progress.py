"""A bytes-read progress bar for the reads that take every byte of a checkpoint.

``inspect --check-values`` and ``--verify-data`` read a whole checkpoint, gigabytes at a time,
through a tree of calls (a root, its steps, their containers, their tensors). The bar is one
per command, so it is ambient, like :func:`ckpt_tools.dcp.sources.reading`: the command opens
it with :func:`bytes_read`, and the readers at the leaves report to :func:`current` -
``expect`` as each container learns how many bytes it will read (the total grows: a root is
read one step at a time), ``advance`` as blocks are read. Outside such a block the progress is
:data:`SILENT`, so the API, ``--json`` and a stderr that is not a terminal print nothing.
tqdm is imported only when a bar is shown.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator
from typing import Any


class ByteProgress:
    """Where readers report; this base reports nowhere."""

    def expect(self, nbytes: int) -> None:
        """``nbytes`` more will be read."""

    def advance(self, nbytes: int) -> None:
        """``nbytes`` were read."""


SILENT = ByteProgress()
_current: contextvars.ContextVar[ByteProgress] = contextvars.ContextVar("byte_progress", default=SILENT)


class _TqdmBar(ByteProgress):
    """A tqdm bar on stderr, cleared when the command is done (its report follows)."""

    def __init__(self, description: str) -> None:
        from tqdm import tqdm

        self.bar: Any = tqdm(
            total=0, unit="B", unit_scale=True, unit_divisor=1024, desc=description, file=sys.stderr, leave=False
        )

    def expect(self, nbytes: int) -> None:
        self.bar.total += nbytes
        self.bar.refresh()

    def advance(self, nbytes: int) -> None:
        self.bar.update(nbytes)


def current() -> ByteProgress:
    """The progress the reads of this block report to (:data:`SILENT` outside :func:`bytes_read`)."""
    return _current.get()


def on_terminal(wanted: bool) -> bool:
    """Whether a bar is shown: ``wanted`` (the command did not ask for JSON) and stderr is a terminal."""
    return wanted and sys.stderr.isatty()


@contextlib.contextmanager
def reporting_to(progress: ByteProgress) -> Iterator[ByteProgress]:
    """Within the block, reads report to ``progress`` (a bar, or any other observer of the bytes read)."""
    token = _current.set(progress)
    try:
        yield progress
    finally:
        _current.reset(token)


@contextlib.contextmanager
def bytes_read(description: str, *, enabled: bool) -> Iterator[ByteProgress]:
    """Within the block, reads report to a bar labelled ``description`` (none when not ``enabled``)."""
    if not enabled:
        yield SILENT
        return
    bar = _TqdmBar(description)
    try:
        with reporting_to(bar):
            yield bar
    finally:
        bar.bar.close()
