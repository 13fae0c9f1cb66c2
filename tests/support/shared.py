"""Build a session fixture once per test session, also when pytest-xdist splits the suite across workers.

Each xdist worker is its own process with its own session fixtures, so the torchrun-built
checkpoints (tens of CPU-seconds each) would be trained once per worker. Here the first worker
to ask builds the fixture in the session's shared temporary directory, under a file lock; the
others wait on the lock and reuse the finished directory. Without xdist it is a plain build in a
fresh directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

_COMPLETE = ".complete"


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The directory ``name`` filled by ``build(root)`` exactly once in this test session.

    A build that raises leaves no completion mark, so every worker that needs the fixture
    reports the failure itself (each retries the build in a fresh directory).
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # no xdist: this process is the whole session
        root = tmp_path_factory.mktemp(name)
        build(root)
        return root
    # Under xdist every worker's basetemp is <session dir>/popen-gwN: the parent is this session's own.
    session_dir = tmp_path_factory.getbasetemp().parent
    root = session_dir / name
    with FileLock(str(session_dir / f"{name}.lock")):
        if not (root / _COMPLETE).exists():
            if root.exists():  # an earlier worker's build failed part-way: start afresh
                root = Path(tmp_path_factory.mktemp(name))
            else:
                root.mkdir()
            build(root)
            (root / _COMPLETE).touch()
    return root
