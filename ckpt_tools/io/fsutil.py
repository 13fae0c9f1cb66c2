"""Durable, atomic file operations: write into a temporary sibling, fsync, rename.

A reader never sees a half-written file under its final name, and a crash leaves either
the old file or the new one. Directory entries are fsynced too, so a rename survives a
power cut and not only a process crash.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

_deferral = threading.local()


@contextlib.contextmanager
def sync_deferred() -> Iterator[None]:
    """Skip the per-file fsyncs of :func:`atomic_write` (and the streaming safetensors writer).

    For files written into a directory that one :func:`fsync_tree` makes durable before it
    is published - a checkpoint's hidden partial directory: every file is then fsynced
    once, by the commit, instead of two or three times. Thread-local, so a background save
    never changes how the loop's own writes behave.
    """
    previous = getattr(_deferral, "active", False)
    _deferral.active = True
    try:
        yield
    finally:
        _deferral.active = previous


def sync_now() -> bool:
    """False inside :func:`sync_deferred` on this thread."""
    return not getattr(_deferral, "active", False)


def fsync_dir(path: Path) -> None:
    """Make the directory entries of ``path`` (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path, already_synced: Callable[[Path], bool] | None = None) -> None:
    """fsync every directory under ``root`` and every file but those ``already_synced`` says
    their writers fsynced themselves (used once before a checkpoint commit)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if already_synced is not None and already_synced(Path(path)):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path``; on success fsync and rename it over ``path``.

    On any exception the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            if sync_now():
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_now():
        fsync_dir(path.parent)


def write_json_atomic(path: Path, payload: Any) -> None:
    with atomic_write(path, "w") as handle:
        json.dump(payload, handle, indent=2)
        handle.write("\n")


def replace_symlink(link: Path, target: str) -> None:
    """Point ``link`` at ``target`` atomically (a reader sees the old or the new target)."""
    tmp = link.with_name(f".{link.name}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)
    fsync_dir(link.parent)


def remove_tree(path: Path) -> None:
    """Remove a directory tree if it exists (a stale partial save, say)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
