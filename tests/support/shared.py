"""Build a session fixture once per test session, also when pytest-xdist splits the suite across workers.

Each xdist worker is its own process with its own session fixtures, so the torchrun-built
checkpoints (tens of CPU-seconds each) would be trained once per worker. Here the first worker
to ask builds the fixture in the session's shared temporary directory, under a file lock; the
others wait on the lock and reuse the finished directory. Without xdist it is a plain build in a
fresh directory.

A fixture made of independent parts (the session's DDP, FSDP and HSDP runs) is built with
:func:`shared_dirs`: a worker that arrives while another builds one part builds a part nobody
has claimed yet instead of waiting, so no core sits idle while the fixture is made.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from filelock import FileLock, Timeout

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
    with FileLock(str(_lock_path(tmp_path_factory, name))):
        return _build_once(tmp_path_factory, name, build)


def shared_dirs(
    tmp_path_factory: pytest.TempPathFactory, names: Sequence[str], build: Callable[[str, Path], None]
) -> dict[str, Path]:
    """:func:`shared_dir` for each of ``names`` (``build(name, root)`` fills one), parts nobody builds first.

    A part another worker is building is waited for only once no unclaimed part is left.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return {name: shared_dir(tmp_path_factory, name, functools.partial(build, name)) for name in names}
    roots: dict[str, Path] = {}
    for blocking in (False, True):
        for name in names:
            if name in roots:
                continue
            lock = FileLock(str(_lock_path(tmp_path_factory, name)), timeout=-1 if blocking else 0)
            try:
                with lock:
                    roots[name] = _build_once(tmp_path_factory, name, functools.partial(build, name))
            except Timeout:  # another worker is building it: build the others first
                continue
    return {name: roots[name] for name in names}


def _lock_path(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    # Under xdist every worker's basetemp is <session dir>/popen-gwN: the parent is this session's own.
    return tmp_path_factory.getbasetemp().parent / f"{name}.lock"


def _build_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """Under the lock of ``name``: its finished directory, built now unless a worker already did."""
    root = tmp_path_factory.getbasetemp().parent / name
    if not (root / _COMPLETE).exists():
        if root.exists():  # an earlier worker's build failed part-way: start afresh
            root = Path(tmp_path_factory.mktemp(name))
        else:
            root.mkdir()
        build(root)
        (root / _COMPLETE).touch()
    return root
