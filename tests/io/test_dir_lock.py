"""The directory lock's rules, with real processes: one owner, abandoned locks told apart from live ones.

The races it closes are tested where they happened (two trainers: tests/train/test_run_lock.py;
two conversions: tests/convert/test_convert_races.py); here each rule on its own, with the
interleavings forced: an owner killed outright, an owner on "another host" (a host identity of
its own) whose heartbeat stopped, two breakers of one abandoned lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt_tools.io import dir_lock
from ckpt_tools.io.dir_lock import LOCK_NAME, DirLock, DirLocked, Owner
from ckpt_tools.io.fsutil import TempSibling
from devtools.procs import REPO

HOLD = "import sys, time; from ckpt_tools.io.dir_lock import DirLock; DirLock(sys.argv[1], 'holder').acquire(); print('held', flush=True); time.sleep(60)"


def holder(directory: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_owner_is_named_and_a_killed_one_is_taken_over_at_once(tmp_path: Path) -> None:
    proc = holder(tmp_path)
    try:
        with pytest.raises(DirLocked, match=rf"in use by holder \(process {proc.pid} on "):
            DirLock(tmp_path, "second").acquire()
    finally:
        proc.kill()
        proc.wait()
    started = time.monotonic()
    with DirLock(tmp_path, "second") as lock:  # same host: its process is gone, nothing to wait for
        assert lock.still_ours()
    assert time.monotonic() - started < 1.0
    assert not (tmp_path / LOCK_NAME).exists()  # released


def test_another_hosts_lock_is_waited_for_until_its_heartbeat_lease_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = holder(tmp_path, {"CKPT_TOOLS_HOST_ID": "host-a", "CKPT_TOOLS_LOCK_HEARTBEAT_S": "0.2"})
    monkeypatch.setenv("CKPT_TOOLS_HOST_ID", "host-b")
    monkeypatch.setattr(dir_lock, "LEASE_S", 2.0)
    monkeypatch.setattr(dir_lock, "HEARTBEAT_S", 0.2)
    try:
        time.sleep(0.6)  # several heartbeats: on another host, a fresh one means live
        with pytest.raises(DirLocked, match="on host-a"):
            DirLock(tmp_path, "second").acquire()
    finally:
        proc.kill()  # its heartbeat stops; from host-b, only the lease can tell
        proc.wait()
    time.sleep(0.6)  # the heartbeat is late now: no longer refused at once, waited for
    started = time.monotonic()
    with DirLock(tmp_path, "second") as lock:
        waited = time.monotonic() - started
        assert lock.still_ours()
    assert 0.5 < waited < 4.0, waited  # not at once (another host), not past the lease by much


def test_of_two_breakers_only_one_removes_the_abandoned_lock(tmp_path: Path) -> None:
    dead = Owner(*dir_lock.host_identity(), pid=2**22 + 1, started="1", token="dead", command="gone")
    assert dir_lock.judge(dead, 0.0) == ("abandoned", 0.0)
    (tmp_path / LOCK_NAME).write_text(json.dumps(dead.__dict__))
    first, second = DirLock(tmp_path, "first"), DirLock(tmp_path, "second")
    first.acquire()  # took over the dead owner's lock
    second._break(dead)  # a second breaker that judged the same dead lock a moment earlier
    assert first.still_ours()  # it did not remove the new owner's lock
    with pytest.raises(DirLocked, match="in use by first"):
        second.acquire()
    first.release()


def test_an_exclusive_commit_never_replaces_a_file_that_appeared(tmp_path: Path) -> None:
    final = tmp_path / "model.safetensors"
    sibling = TempSibling(final)
    sibling.close(sync=False)
    final.write_text("another process's file")  # appears between the check and the commit
    with pytest.raises(FileExistsError):
        sibling.commit(exclusive=True)
    sibling.abort()
    assert final.read_text() == "another process's file"
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


def test_an_earlier_attempt_of_the_same_torchrun_job_is_taken_over_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """An elastic restart may put rank 0 on another host; the job's earlier attempt is stopped by then."""
    monkeypatch.setenv("CKPT_TOOLS_HOST_ID", "host-b")
    earlier = Owner("host-a", "host-a", 4242, "", "t", "ckpt-train", job="job-1", attempt=0)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert dir_lock.judge(earlier, 0.0) == ("abandoned", 0.0)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-2")  # another job: a fresh heartbeat is a live owner
    assert dir_lock.judge(earlier, 0.0) == ("live", 0.0)


def test_a_temporary_of_another_host_is_never_judged_abandoned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process id says nothing about a process of another host: its leftover is named, not removed."""
    from ckpt_tools.io.fsutil import find_leftovers

    monkeypatch.setenv("CKPT_TOOLS_HOST_ID", "host-a")
    sibling = TempSibling(tmp_path / "model.safetensors")  # a writer on host-a, still writing
    sibling.close(sync=False)
    (mine,) = find_leftovers(tmp_path)
    assert mine.pid == os.getpid() and not mine.elsewhere and mine.abandoned  # this process: an earlier call's
    monkeypatch.setenv("CKPT_TOOLS_HOST_ID", "host-b")  # seen from another host sharing the directory
    (theirs,) = find_leftovers(tmp_path)
    assert theirs.elsewhere and not theirs.abandoned
    assert "of another host" in theirs.describe()
    sibling.abort()
