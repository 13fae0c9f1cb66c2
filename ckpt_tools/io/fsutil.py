"""Durable, atomic file operations: write into a temporary sibling, fsync, rename; delete by moving aside.

A reader never sees a half-written file under its final name, and a crash leaves either
the old file or the new one. Directory entries are fsynced too, so a rename survives a
power cut and not only a process crash.

Every atomic writer of the project (:func:`atomic_write`, the streaming safetensors writer,
``convert-dcp``'s index) goes through :class:`TempSibling`, and :func:`delete_aside` is the one
way a directory is deleted so that an interruption leaves it whole or gone. What a killed
writer or deletion leaves behind is named here once (:func:`temp_sibling_prefix`,
:func:`deleting_name`) and recognised here (:func:`find_leftovers`): ``inspect`` names
leftovers, ``convert-dcp`` removes its own on a rerun.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ckpt_tools.io.host import host_tag

_deferral = threading.local()
_umask_lock = threading.Lock()
FILE_MODE = 0o666  # what open() asks for; the process umask takes its bits away, as for torch's DCP shards


def current_umask() -> int:
    """The process umask, read without changing it where the kernel says it (Linux ≥ 4.7).

    ``os.umask`` can only be read by setting it, which would give a file another thread creates
    at that moment the wrong mode; ``/proc/self/status`` reports it without that. Elsewhere the
    set-and-restore is done under a lock, the best that can be done.
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def apply_umask_mode(fd: int) -> None:
    """Give a file created by :func:`tempfile.mkstemp` (always 0600) the mode ``open()`` would have given it.

    The project's writers go through temporary siblings (:class:`TempSibling`) that ``mkstemp``
    creates private; once renamed they are the user's configs, weights and state, and must follow
    the umask (``0o666 & ~umask``: 0644 under the usual 022, 0600 under 077) like every file torch
    writes. Called on the open descriptor, before the rename, so the final name never shows
    another mode.
    """
    os.fchmod(fd, FILE_MODE & ~current_umask())


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


# ---------------------------------------------------------------------- temporary siblings

TEMP_SUFFIX = ".tmp"
DELETING_MARK = ".deleting-"


def temp_sibling_prefix(final_name: str, pid: int | None = None) -> str:
    """How a file being written is named until it is complete: ``.<name>.<pid>@<host>-<random>.tmp``.

    Hidden, so no reader (and no Hub upload) takes it for the file; the writer's process id and
    host (:func:`~ckpt_tools.io.host.host_tag`), so a later run can tell one a killed writer
    abandoned from one still being written - on shared storage only on the writer's own host.
    """
    return f".{final_name}.{_process(pid)}-"


def deleting_name(final_name: str, pid: int | None = None) -> str:
    """Where :func:`delete_aside` moves a directory before removing it: ``.<name>.deleting-<pid>@<host>``."""
    return f".{final_name}{DELETING_MARK}{_process(pid)}"


def _process(pid: int | None) -> str:
    return f"{os.getpid() if pid is None else pid}@{host_tag()}"


class TempSibling:
    """A hidden temporary file next to ``path`` that only :meth:`commit` turns into ``path``.

    The one primitive behind every atomic file write: create (named by
    :func:`temp_sibling_prefix`), write through :attr:`fd` or :meth:`open`, :meth:`close`
    (fsync), :meth:`commit` (rename over ``path``) - or :meth:`abort` on any failure, which
    removes it. Raises ``OSError`` as the calls it makes do; callers word the message.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        fd, name = tempfile.mkstemp(
            prefix=temp_sibling_prefix(self.path.name), suffix=TEMP_SUFFIX, dir=self.path.parent
        )
        self.fd: int | None = fd
        self.tmp: Path | None = Path(name)
        try:
            apply_umask_mode(fd)  # mkstemp creates it 0600; the committed file follows the umask
        except BaseException:
            self.abort()
            raise

    def open(self, mode: str) -> IO[Any]:
        """A file object over :attr:`fd`; it owns the descriptor from now on (closing it closes the file)."""
        assert self.fd is not None
        fd, self.fd = self.fd, None
        return os.fdopen(fd, mode)

    def close(self, *, sync: bool) -> None:
        """Everything written: fsync (when ``sync``) and close the descriptor."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def commit(self, *, exclusive: bool = False) -> None:
        """Rename the temporary over ``path`` (a reader sees the old file or the new one).

        ``exclusive``: only if ``path`` does not exist - a file that appeared there since the
        caller looked is never replaced (``FileExistsError``). A hard link is the atomic
        "create unless it exists" for a complete file; where the file system has none, the
        check and the rename are two steps (a race window of one system call).
        """
        assert self.tmp is not None and self.fd is None
        if exclusive:
            try:
                os.link(self.tmp, self.path)
            except FileExistsError:
                raise
            except OSError:  # no hard links here (FAT, some network and FUSE file systems)
                if os.path.lexists(self.path):
                    raise FileExistsError(errno.EEXIST, "exists", str(self.path)) from None
                os.replace(self.tmp, self.path)
            else:
                os.unlink(self.tmp)
        else:
            os.replace(self.tmp, self.path)
        self.tmp = None

    def abort(self) -> None:
        """Close and remove the temporary (idempotent; ``path`` is untouched)."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)
            self.tmp = None


@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path``; on success fsync and rename it over ``path``.

    On any exception the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    sibling = TempSibling(path)
    try:
        with sibling.open(mode) as handle:
            yield handle
            handle.flush()
            if sync_now():
                os.fsync(handle.fileno())
        sibling.commit()
    except BaseException:
        sibling.abort()
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


# What a file system answers when it cannot hold a symlink at all (Windows shares, some FUSE,
# network and object-store mounts); any other failure is a real write error.
SYMLINK_REFUSED = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def replace_pointer_file(path: Path, target: str) -> None:
    """Replace ``path`` by a small file holding ``target`` atomically (temporary sibling, fsync, rename).

    The stand-in for a symlink where none can be made: a reader sees the old content (or the
    old symlink) or the new, never a half-written name.
    """
    sibling = TempSibling(path)
    try:
        os.write(sibling.fd, (target + "\n").encode())  # type: ignore[arg-type]
        sibling.close(sync=True)  # always durable: ``last`` moves only after the step it names is
        sibling.commit()
    except BaseException:
        sibling.abort()
        raise
    fsync_dir(path.parent)


def replace_link_or_pointer(link: Path, target: str, *, pointer_file: bool = False) -> bool:
    """Point ``link`` at ``target``: a symlink, or a pointer file where the file system refuses symlinks.

    ``pointer_file``: always the file (for stores that mangle symlinks). Returns whether a
    pointer file was written. Either way the replacement is one atomic rename.
    """
    if not pointer_file:
        try:
            replace_symlink(link, target)
            return False
        except OSError as e:
            if e.errno not in SYMLINK_REFUSED:
                raise
    replace_pointer_file(link, target)
    return True


def remove_tree(path: Path) -> None:
    """Remove a directory tree if it exists (a stale partial save, say)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def delete_aside(path: Path) -> None:
    """Delete the directory ``path`` so that an interruption leaves it whole under its name or gone from it.

    One atomic rename moves it to a hidden sibling (:func:`deleting_name`) - from then on every
    reader sees it gone - and only that sibling is then removed file by file. A kill during the
    removal leaves a ``.deleting`` leftover that :func:`find_leftovers` reports and a rerun
    finishes; a directory left half-deleted under its own name never exists.
    """
    aside = path.with_name(deleting_name(path.name))
    if aside.exists():  # this process's own earlier, interrupted attempt
        remove_tree(aside)
    os.replace(path, aside)
    fsync_dir(path.parent)
    shutil.rmtree(aside)


# ---------------------------------------------------------------------- leftovers


@dataclass(frozen=True)
class Leftover:
    """What an interrupted writer (a temporary sibling) or deletion (a moved-aside directory) left."""

    path: Path
    target: str  # the final name it was for
    pid: int | None  # the process that made it (None: a name without one, from an older writer)
    deleting: bool  # a directory :func:`delete_aside` moved aside, not a temporary file
    host: str | None = None  # the host tag of that process (None: a name from before hosts were named)

    @property
    def elsewhere(self) -> bool:
        """Made by a process of another host (or another boot of this one): its id says nothing here."""
        return self.host is not None and self.host != host_tag()

    @property
    def abandoned(self) -> bool:
        """No live writer can be using it: its process (on this host) is gone, or it is this process
        (which runs one conversion at a time, so its own leftover is from an earlier, interrupted
        call). One from another host is never judged abandoned: its process cannot be seen from here."""
        if self.pid is None or self.elsewhere:
            return False
        return self.pid == os.getpid() or not process_alive(self.pid)

    def describe(self) -> str:
        """One line for ``inspect``: what it is, who left it, what removes it."""
        who = f"process {self.pid}" if self.pid is not None else "an unknown process"
        if self.elsewhere:
            who += " of another host"
        state = "" if self.pid is None or self.abandoned or self.elsewhere else ", still running"
        if self.elsewhere:
            return (
                f"{'directory ' + self.target + '/ moved aside by a deletion' if self.deleting else 'temporary file of a write of ' + self.target}"
                f" ({who}); a rerun there removes it once that process is gone, or remove it by hand"
            )
        if self.deleting:
            return f"{self.target}/ moved aside by an interrupted deletion ({who}{state}); rerunning the same command finishes it"
        return f"temporary file of an interrupted write of {self.target} ({who}{state}); rerunning the same command removes it"


def parse_leftover(path: Path) -> Leftover | None:
    """The :class:`Leftover` ``path`` is by its name, or None (any other file)."""
    name = path.name
    if not name.startswith(".") or len(name) < 2:
        return None
    if DELETING_MARK in name:
        target, _, process = name[1:].rpartition(DELETING_MARK)
        pid, host = _split_process(process)
        if target and pid is not None:
            return Leftover(path, target, pid, deleting=True, host=host)
        return None
    if not name.endswith(TEMP_SUFFIX) or len(name) <= 1 + len(TEMP_SUFFIX):
        return None
    body = name[1 : -len(TEMP_SUFFIX)]
    target, _, token = body.rpartition(".")
    if not target:  # ".last.tmp": a fixed name, no token
        return Leftover(path, body, None, deleting=False)
    pid, host = _split_process(token.split("-", 1)[0]) if "-" in token else (None, None)
    return Leftover(path, target, pid, deleting=False, host=host)


def _split_process(text: str) -> tuple[int | None, str | None]:
    """``<pid>@<host tag>`` (or a bare ``<pid>``, of writers before hosts were named) -> (pid, host)."""
    pid, _, host = text.partition("@")
    if not pid.isdigit():
        return None, None
    return int(pid), host or None


def find_leftovers(directory: Path) -> list[Leftover]:
    """The leftovers directly inside ``directory`` (none when it is not a readable directory)."""
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return []
    found = (parse_leftover(p) for p in entries)
    return [lo for lo in found if lo is not None]


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (a process we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True
