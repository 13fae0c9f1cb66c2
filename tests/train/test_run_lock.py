"""One run per output directory: a second ckpt-train on it is refused in one line, also across hosts.

Before, two runs started together on one ``--output_dir`` both printed "saved" and exited 0, one
run's checkpoints silently replaced by the other's. The interleaving is forced: the second run
starts once the first one owns the directory (its lock file exists).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from ckpt_tools.io.dir_lock import LOCK_NAME
from devtools.procs import kill_tree
from devtools.training import TINY, start_train, train, train_multinode

pytestmark = pytest.mark.torchrun

LONG = [*TINY, "--steps=400", "--save_freq=100", "--log_freq=100"]


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_second_run_on_the_same_output_dir_is_refused_and_the_first_one_finishes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = start_train([*LONG, f"--output_dir={out}"], text=True, stdout=-1, stderr=-1)
    try:
        wait_for(out / LOCK_NAME)
        second = train(*TINY, "--steps=4", f"--output_dir={out}", timeout=120)
        assert second.returncode == 2, second.stderr[-2000:]
        lines = [x for x in second.stderr.splitlines() if x.strip()]
        assert lines == [
            f"error: --output_dir={out} is in use by ckpt-train (process {first.pid} on {os.uname().nodename});"
            " one run per output directory: wait for it to end, or choose another"
        ], second.stderr
        _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err[-2000:]
    finally:
        kill_tree(first.pid)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["000100", "000200", "000300", "000400", "last"]
    assert not (out / LOCK_NAME).exists()  # released at the end


def test_a_run_on_two_hosts_owns_its_output_dir_until_it_is_killed(tmp_path: Path) -> None:
    """Two torchrun agents on loopback as two hosts; a third "host" is refused, then, once the job is
    killed outright, waits out the lease of its stopped heartbeat and takes over."""
    out = tmp_path / "run"
    lease = {"CKPT_TOOLS_LOCK_HEARTBEAT_S": "0.3", "CKPT_TOOLS_LOCK_LEASE_S": "2.5"}
    wrappers = {node: ["env", f"CKPT_TOOLS_HOST_ID=host-{node}"] for node in (0, 1)}
    results: list[object] = []
    job = threading.Thread(
        target=lambda: results.extend(
            train_multinode(*LONG, f"--output_dir={out}", nproc_per_node=1, env=lease, wrappers=wrappers, timeout=300)
        )
    )
    job.start()
    try:
        wait_for(out / LOCK_NAME)
        refused = train(
            *TINY, "--steps=4", f"--output_dir={out}", env={**lease, "CKPT_TOOLS_HOST_ID": "host-9"}, timeout=120
        )
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert f"--output_dir={out} is in use by ckpt-train (process " in refused.stderr
        assert " on host-0);" in refused.stderr  # rank 0's agent owns it
    finally:
        for agent in _agents_of(out):
            os.kill(agent, signal.SIGKILL)
        job.join(timeout=120)
    assert (out / LOCK_NAME).exists()  # killed outright: nothing released it
    started = time.monotonic()
    taken = train(
        *TINY,
        "--steps=4",
        "--resume=auto",
        f"--output_dir={out}",
        env={**lease, "CKPT_TOOLS_HOST_ID": "host-9"},
        timeout=180,
    )
    assert taken.returncode == 0, taken.stderr[-3000:]
    assert time.monotonic() - started >= 1.0  # it waited for the lease, not took a live-looking lock


def _agents_of(out: Path) -> list[int]:
    """The processes (torchrun agents and workers) of the job writing into ``out``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"--output_dir={out}" in cmdline and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found
