"""One writer per directory, also when the writers run on several hosts over shared storage.

Two ``ckpt-train`` runs started together on one ``--output_dir`` (a scheduler that retries a
job, two people, a copy-pasted command) both passed the "already holds checkpoints" check and
silently replaced each other's checkpoints; two ``convert-dcp`` runs into one output did the
same to their outputs. A check and the write after it are a race; an owner is not.

The lock is a file created with ``O_CREAT | O_EXCL`` (atomic on local disks, NFS, Lustre, and
the cluster file systems checkpoints live on), holding who owns it: host, boot id, process id
and its start time, and a random token. While held, a thread touches it every
:data:`HEARTBEAT_S`. It is released (removed, if it still holds our token) when the owner ends
- normally, on an exception, or on SIGTERM through the interpreter's exit. A lock whose owner
was killed outright is recognized as abandoned without guessing:

- owner on this host (same host name and boot id): abandoned exactly when its process is gone
  (a reused process id is told apart by its start time);
- owner of an earlier attempt of the same torchrun job (its run id, a lower restart count):
  abandoned - torchrun stops every worker of an attempt before it starts the next;
- owner on another host: we cannot see its processes, so its heartbeat decides - abandoned when
  the file has not been touched for :data:`LEASE_S`, measured on the storage's own clock (the
  modification time of a file we just touched beside it), so clocks that differ between hosts
  do not matter. A heartbeat a little late makes the next owner wait for the lease, never take
  over a live lock.

Taking over an abandoned lock is itself exclusive (a second ``O_EXCL`` file), so of two
processes that both find it abandoned only one removes it, and only if it still holds the
token that was judged.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ckpt_tools.errors import WriteError
from ckpt_tools.io.fsutil import process_alive
from ckpt_tools.io.host import host_identity

LOCK_NAME = ".ckpt-tools.lock"
BREAK_SUFFIX = ".break"
HEARTBEAT_S = float(os.environ.get("CKPT_TOOLS_LOCK_HEARTBEAT_S", "5"))
LEASE_S = float(os.environ.get("CKPT_TOOLS_LOCK_LEASE_S", "30"))
_ATTEMPTS = 5
_HELD: set[str] = set()  # tokens of the locks this process holds now


class DirLocked(Exception):
    """The directory is owned by a live process; the message names it."""


@dataclass(frozen=True)
class Owner:
    host: str
    boot: str
    pid: int
    started: str  # the process' start time as the kernel counts it ("" where unknown)
    token: str
    command: str
    job: str = ""  # torchrun's run id: the same across the restarts of one job
    attempt: int = 0  # torchrun's restart count

    def restarted_by(self, job: str, attempt: int) -> bool:
        """Whether a process of ``job``'s attempt ``attempt`` is a restart of this owner's job: torchrun
        stops every worker of an attempt before it starts the next, wherever they ran."""
        return bool(self.job) and self.job == job and attempt > self.attempt

    def describe(self) -> str:
        return f"{self.command} (process {self.pid} on {self.host})"


def this_owner(command: str) -> Owner:
    host, boot = host_identity()
    job, attempt = job_identity()
    return Owner(host, boot, os.getpid(), process_start(os.getpid()), secrets.token_hex(8), command, job, attempt)


def job_identity() -> tuple[str, int]:
    """(torchrun's run id, its restart count) - ("", 0) outside torchrun."""
    try:
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        attempt = 0
    return os.environ.get("TORCHELASTIC_RUN_ID", ""), attempt


def process_start(pid: int) -> str:
    """The start time of ``pid`` in clock ticks since boot ("" where /proc does not say)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]  # field 22 of stat(5), counted after the command name


class DirLock:
    """Exclusive ownership of ``directory`` (created if missing) by this process, for ``command``."""

    def __init__(self, directory: Path, command: str, name: str = LOCK_NAME) -> None:
        """``name``: the lock file's name in ``directory`` (another name: another lock, e.g. a reader's lease)."""
        self.directory = Path(directory)
        self.path = self.directory / name
        self.owner = this_owner(command)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.held = False

    def acquire_for_writing(self, busy: str, failed: str = "") -> None:
        """:meth:`acquire`, a refusal as the one :class:`WriteError` line a command prints: ``busy``
        follows the owner's description, ``failed`` what could not take the lock at all."""
        try:
            self.acquire()
        except DirLocked as e:
            raise WriteError(f"{e}; {busy}") from None
        except OSError as e:
            raise WriteError(f"{self.directory}: cannot take its lock ({e.strerror or e}){failed}") from None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`DirLocked` naming the owner (an abandoned lock is taken over;
        one whose heartbeat stopped less than :data:`LEASE_S` ago is waited for)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        breaks = 0
        deadline = time.monotonic() + LEASE_S + 2 * HEARTBEAT_S + 5  # waiting out one late heartbeat at most
        while breaks < _ATTEMPTS and time.monotonic() < deadline:
            if self._create():
                self.held = True
                _HELD.add(self.owner.token)
                self._beat = threading.Thread(target=self._heartbeat, name="ckpt-tools-lock", daemon=True)
                self._beat.start()
                atexit.register(self.release)
                return
            found = self._read()
            verdict, wait_s = judge(found, self._age())
            if verdict == "live":
                assert found is not None
                raise DirLocked(f"{self.directory} is in use by {found.describe()}")
            if verdict == "waiting":
                time.sleep(wait_s)
                continue
            breaks += 1
            self._break(found)
        raise DirLocked(f"{self.directory}: could not take its lock ({self.path}); another process keeps taking it")

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still ours (idempotent)."""
        self._stop.set()
        if not self.held:
            return
        self.held = False
        _HELD.discard(self.owner.token)
        with contextlib.suppress(OSError):
            found = self._read()
            if found is not None and found.token == self.owner.token:
                self.path.unlink()
        atexit.unregister(self.release)

    def still_ours(self) -> bool:
        """Whether the lock file still names this owner (False: it was taken over after a long stall)."""
        found = self._read()
        return found is not None and found.token == self.owner.token

    def __enter__(self) -> DirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ------------------------------------------------------------------ internals

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, json.dumps(asdict(self.owner)).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def _read(self) -> Owner | None:
        return read_owner(self.path)

    def _age(self) -> float | None:
        return lock_age(self.path, self.owner.token)

    def _break(self, judged: Owner | None) -> None:
        """Remove the abandoned lock ``judged``, exclusively and only if it is still that one."""
        mutex = self.path.with_name(LOCK_NAME + BREAK_SUFFIX)
        try:
            fd = os.open(mutex, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            with contextlib.suppress(OSError):
                if time.time() - mutex.stat().st_mtime > LEASE_S:
                    mutex.unlink()  # a breaker that died mid-way
            time.sleep(0.05)
            return
        os.close(fd)
        try:
            now = self._read()
            same = (now is None and judged is None) or (
                now is not None and judged is not None and now.token == judged.token
            )
            if same:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
        finally:
            mutex.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)


def read_owner(path: Path) -> Owner | None:
    """Who a lock file names (None: gone, being written this instant, or not ours to read: judged by age)."""
    try:
        doc: Any = json.loads(path.read_bytes()[: 2**16])
        return Owner(**{k: doc[k] for k in Owner.__dataclass_fields__ if k in doc})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lock_age(path: Path, token: str) -> float | None:
    """Seconds since the lock file ``path`` was last touched, on the storage's clock (None: it is gone)."""
    probe = path.parent / f".ckpt-tools-clock-{token}"
    try:
        probe.write_bytes(b"")
        now = probe.stat().st_mtime
        probe.unlink()
        return max(0.0, now - path.stat().st_mtime)
    except FileNotFoundError:
        return None
    except OSError:
        return 0.0  # cannot tell: never judge a lock abandoned on a guess


def held_by_live_owner(path: Path) -> bool:
    """Whether the lock file ``path`` is held now, by the liveness rules of :func:`judge`.

    A lock being written this instant or whose heartbeat is late counts as held: the cautious
    answer for whoever would otherwise delete what it guards.
    """
    verdict, _ = judge(read_owner(path), lock_age(path, secrets.token_hex(8)))
    return verdict != "abandoned"


def judge(owner: Owner | None, age: float | None) -> tuple[str, float]:
    """("live" | "abandoned" | "waiting", seconds to wait) for a lock of ``owner`` touched ``age`` s ago."""
    if age is None:
        return "abandoned", 0.0  # removed meanwhile: just try again
    host, boot = host_identity()
    if owner is not None and owner.restarted_by(*job_identity()):
        return "abandoned", 0.0
    if owner is not None and owner.host == host and owner.boot == boot:
        if owner.pid == os.getpid():  # this process: live while it holds that lock
            return ("live", 0.0) if owner.token in _HELD else ("abandoned", 0.0)
        alive = process_start(owner.pid) == owner.started if owner.started else process_alive(owner.pid)
        return ("live", 0.0) if alive else ("abandoned", 0.0)
    if age >= LEASE_S:
        return "abandoned", 0.0
    if owner is None or age > 2 * HEARTBEAT_S:
        # Being written this instant, or its heartbeat is late: the lease decides, soon.
        return "waiting", min(LEASE_S - age, max(HEARTBEAT_S, 0.1))
    return "live", 0.0
