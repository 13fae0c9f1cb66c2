"""``dcp_save``'s writer threads: how many, and that a failed write is never silent.

torch's ``FileSystemWriter`` drops the exceptions of its extra writer threads; the save
would return as if complete. On this CI's two cores a torchrun job gets one thread per rank,
so the threaded path is exercised here, in one process: a file-size limit makes one shard
file fail mid-write, and the save must raise that OSError (EFBIG), not return.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckpt_tools.train.checkpoint.dcp_io import writer_threads_per_rank

SAVE_WITH_A_FULL_DISK = textwrap.dedent(
    """
    import errno, sys, warnings
    from pathlib import Path
    import torch
    from ckpt_tools.train.checkpoint.dcp_io import dcp_save, os_error_in

    warnings.simplefilter("ignore")  # "no process group: saving in a single process"
    state = {"model": {f"w{i}": torch.full((1 << 18,), float(i)) for i in range(8)}}  # 8 x 1 MiB
    try:
        dcp_save(state, Path(sys.argv[1]), None)
    except BaseException as e:
        cause = os_error_in(e)
        print("raised", type(cause).__name__, getattr(cause, "errno", None) == errno.EFBIG)
    else:
        print("returned")
    """
)


def test_a_write_failure_in_a_writer_thread_fails_the_save(tmp_path: Path) -> None:
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, 3 << 20))  # each of 2+ files gets ~4 MiB

    env = {k: v for k, v in os.environ.items() if k != "LOCAL_WORLD_SIZE"}
    proc = subprocess.run(
        [sys.executable, "-c", SAVE_WITH_A_FULL_DISK, str(tmp_path / "dcp")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        preexec_fn=limit,
    )
    assert proc.stdout.strip() == "raised OSError True", proc.stdout + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr  # the writer thread's traceback is silenced, not printed


def test_writer_threads_are_the_cores_per_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    cores = len(os.sched_getaffinity(0))

    def threads(local_ranks: int) -> int:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
        return writer_threads_per_rank()

    assert threads(1) == min(4, cores)  # a lone rank: every core, at most 4 threads
    assert threads(cores) == 1  # as many ranks as cores (this CI: 2 on 2): one thread each
    assert threads(64 * cores) == 1  # oversubscribed: never fewer than one
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert writer_threads_per_rank() == min(4, cores)  # not under torchrun: one local rank
