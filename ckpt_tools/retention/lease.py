"""A reader's lease on a checkpoint step: retention never removes a step someone is reading.

``convert-dcp`` or ``push`` may read a step for minutes while the trainer's
``--checkpoint.keep_last_n`` or a ``ckpt-tools prune`` decides what to remove. A reader marks
the step in use with a lease file in the checkpoints root, beside the step (the step's own
files stay exactly as the save wrote them): ``.reading-<step>.<token>.lease``. The lease is a
:class:`~ckpt_tools.io.dir_lock.DirLock` under another name, so its owner, heartbeat and
liveness are that lock's rules: a lease whose process is gone (on this host), or whose
heartbeat stopped (from another host), no longer holds.

Race-free without a global lock: the reader creates its lease, then checks that the step is
still there; a remover moves the step aside, then checks for leases, and moves it back if one
holds (:mod:`ckpt_tools.retention`). Whichever looks second sees the other.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

from ckpt_tools.errors import CheckpointError, CkptError
from ckpt_tools.format import layout
from ckpt_tools.io.dir_lock import DirLock, DirLocked, held_by_live_owner
from ckpt_tools.io.remote import remote_file

LEASE_PREFIX = ".reading-"
LEASE_SUFFIX = ".lease"
_LEASE_RE = re.compile(r"^\.reading-(\d{6,})\.[0-9a-f]+\.lease$")


def lease_name(step_name: str) -> str:
    return f"{LEASE_PREFIX}{step_name}.{secrets.token_hex(8)}{LEASE_SUFFIX}"


def leased_step_names(checkpoints_root: Path) -> set[str]:
    """The step directory names a live reader holds a lease on (abandoned leases are ignored)."""
    try:
        entries = list(checkpoints_root.iterdir())
    except OSError:
        return set()
    held = set()
    for entry in entries:
        m = _LEASE_RE.match(entry.name)
        if m and held_by_live_owner(entry):
            held.add(m.group(1))
    return held


def remove_abandoned_leases(checkpoints_root: Path) -> int:
    """Remove the leases of readers that are gone (killed outright); returns how many.

    Safe without a lock: a lease's token is its own, so once its owner is judged gone no one
    will ever touch it again.
    """
    removed = 0
    with contextlib.suppress(OSError):
        for entry in list(checkpoints_root.iterdir()):
            if _LEASE_RE.match(entry.name) and not held_by_live_owner(entry):
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
                    removed += 1
    return removed


@contextlib.contextmanager
def reading(step_dir: Path, command: str) -> Iterator[None]:
    """Hold a lease on ``step_dir`` while the block reads it (nothing when it is no step of a checkpoints root).

    Where the lease cannot be written (a read-only checkpoints root, which nothing can prune
    either) the read goes on without one.
    """
    root = step_dir.parent
    if root.name != layout.CHECKPOINTS_DIR or not layout.is_step_dir_name(step_dir.name):
        yield
        return
    lease = DirLock(root, command, name=lease_name(step_dir.name))
    try:
        lease.acquire()
    except (OSError, DirLocked):
        yield
        return
    try:
        if not step_dir.is_dir():
            raise CheckpointError(f"{step_dir}: removed by retention (a prune) as it was opened; run again")
        yield
    finally:
        lease.release()


@contextlib.contextmanager
def reading_path(path: Path, command: str) -> Iterator[None]:
    """:func:`reading` the step a user's path names (``last``, a run, a step, anything in one); a path
    that names no step is read without a lease, and the command reports it as it would have."""
    if remote_file(path) is not None:  # a checkpoint on the Hub: a commit is immutable, no one prunes it
        yield
        return
    try:
        step_dir = layout.resolve_step(path).root
    except CkptError:
        yield
        return
    with reading(Path(step_dir), command):
        yield
