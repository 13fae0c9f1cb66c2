"""Shared fixtures, and the ``torchrun`` marker that splits the suite into two lanes.

The fixtures that start real training or torchrun jobs are session-scoped and built once:
``runs`` (DDP / FSDP / HSDP runs of the training core) and ``ckpts`` (the DCP variants of
``tests/support/dcp_writer.py``). Every test that starts a job - itself, through a helper, or
through a fixture such as these - is marked ``torchrun`` here (found from the code, see
:mod:`tests.support.lanes`), so ``pytest -m "not torchrun"`` (the fast lane) never waits for
one; and a launch from an unmarked test fails (``devtools.procs.IN_PROCESS_ONLY_ENV``).
"""

from __future__ import annotations

import compileall
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.procs import IN_PROCESS_ONLY_ENV, REPO
from devtools.training import FIXTURE_LAYOUTS, LAYOUTS, RUN, ok, train
from tests.fakes.hub.server import HubServer
from tests.support.dcp_fixtures import write_checkpoints
from tests.support.hub_fixtures import HUB_ORG, HUB_USER, HubEndpoint, hub_process_env, new_token
from tests.support.lanes import starts_jobs
from tests.support.shared import shared_dir, shared_dirs


def _private_cache() -> None:
    """The tools' index cache in a folder of this test session (inherited by every launched
    process), never the user's ``~/.cache``: a test sees no entry an earlier run left."""
    import atexit
    import shutil
    import tempfile

    from ckpt_tools.dcp.cache import CACHE_DIR_ENV

    if CACHE_DIR_ENV not in os.environ:
        os.environ[CACHE_DIR_ENV] = folder = tempfile.mkdtemp(prefix="ckpt-tools-cache-")
        atexit.register(shutil.rmtree, folder, True)  # the session that made it removes it


_private_cache()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile this checkout's packages once, before any test launches a process.

    With PYTHONDONTWRITEBYTECODE set (CI images set it), Python never caches bytecode, so every
    launched trainer and tool would compile the project's modules again: about half a CPU second
    per process. Cached bytecode is read even with the variable set.
    """
    if not hasattr(session.config, "workerinput"):  # the controller, once, not every xdist worker
        for package in ("ckpt_tools", "devtools"):
            compileall.compile_dir(REPO / package, quiet=1)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("torchrun") is None and starts_jobs(item):
            item.add_marker(pytest.mark.torchrun)
    # Files that start jobs first, so that under xdist (one file per worker) the long ones are
    # not left for the end and the quick in-process files fill the last gaps of both workers.
    slow_files = {item.path for item in items if item.get_closest_marker("torchrun") is not None}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture of ``item`` is set up: forbid launches unless it is marked ``torchrun``."""
    if item.get_closest_marker("torchrun") is None:
        os.environ[IN_PROCESS_ONLY_ENV] = item.nodeid
    else:
        os.environ.pop(IN_PROCESS_ONLY_ENV, None)


def pytest_sessionfinish() -> None:
    os.environ.pop(IN_PROCESS_ONLY_ENV, None)


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """8-step runs saving every 4 steps: DDP(2) safetensors, FSDP(2) safetensors_dcp, HSDP(2×2) dcp.

    Each run is its own shared part, so two workers that need them at once train two of them.
    """
    roots = shared_dirs(tmp_path_factory, [f"layout-{name}" for name in FIXTURE_LAYOUTS], _train_layout)
    return {name: roots[f"layout-{name}"] / name for name in FIXTURE_LAYOUTS}


def _train_layout(part: str, root: Path) -> None:
    name = part.removeprefix("layout-")
    nproc, flags = LAYOUTS[name]
    proc = ok(train(*RUN, *flags, f"--output_dir={root / name}", nproc=nproc))
    (root / f"{name}.stdout").write_text(proc.stdout)


@pytest.fixture(scope="session")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DCP checkpoints torch wrote under a 4-rank torchrun (paths in tests/support/dcp_fixtures.py)."""
    return shared_dir(tmp_path_factory, "dcp", write_checkpoints)


@pytest.fixture
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubEndpoint]:
    """A fresh loopback Hub (user ``alice``, member of org ``robot-lab``) and an environment pointing at it."""
    token = new_token()
    hf_home = tmp_path_factory.mktemp("hf_home")
    server = HubServer({token: HUB_USER}, orgs={HUB_USER: {HUB_ORG}})
    with server:
        yield HubEndpoint(server.url, server, hub_process_env(server.url, token, hf_home))
