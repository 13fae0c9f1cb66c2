"""The output directory of a conversion: owned (locked) while written, and left as found after a failure."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ckpt_tools.io.dir_lock import DirLock


@contextlib.contextmanager
def owning(output_dir: Path) -> Iterator[None]:
    """This process owns ``output_dir`` (:mod:`ckpt_tools.io.dir_lock`) while it writes and deletes there:
    a second conversion into it is refused in one line instead of replacing the first one's files."""
    created = None if output_dir.exists() else existing_parent(output_dir)
    lock = DirLock(output_dir, "convert-dcp")
    lock.acquire_for_writing("one conversion per output directory at a time: wait for it to end")
    try:
        yield
    finally:
        lock.release()
        if created is not None:
            remove_empty_dirs(output_dir, created)


def existing_parent(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def remove_empty_dirs(path: Path, stop: Path) -> None:
    """Remove ``path`` and its parents up to ``stop`` (excluded) while they are empty: what a failure created."""
    while path != stop and path.is_dir():
        try:
            path.rmdir()
        except OSError:
            return
        path = path.parent
