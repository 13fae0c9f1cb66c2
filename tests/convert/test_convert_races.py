"""Two processes writing one conversion's output at once: nothing replaced silently, shards never lost.

Before, two ``convert-dcp`` runs into one output both exited 0 (the second silently replaced
the first one's files), and ``--delete-dcp`` deleted the shards after another conversion had
replaced the output it verified - only the other's (lossy) output remained. The interleavings
are forced here: the second writer acts at the exact point where it used to slip in.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_tools.convert import convert_dcp, delete_converted_dcp
from ckpt_tools.errors import WriteError
from ckpt_tools.format import layout as L
from ckpt_tools.io.dir_lock import LOCK_NAME
from devtools.procs import REPO, launch_env

STEP = "000008"
HOLD = "import sys, time; from ckpt_tools.io.dir_lock import DirLock; DirLock(sys.argv[1], 'convert-dcp').acquire(); print('held', flush=True); time.sleep(60)"


@pytest.fixture
def step(runs: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of the HSDP run's step 8 (weights only as DCP shards)."""
    return Path(shutil.copytree(step_dir_of(runs["hsdp"]), tmp_path / "run" / L.CHECKPOINTS_DIR / STEP))


def step_dir_of(run: Path) -> Path:
    return run / L.CHECKPOINTS_DIR / STEP


def test_a_second_conversion_into_an_output_in_use_is_refused(step: Path, tmp_path: Path) -> None:
    out = tmp_path / "converted"
    other = subprocess.Popen(  # another conversion, mid-way: it owns the output directory
        [sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True, env=launch_env()
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
        proc = subprocess.run(
            [sys.executable, "-m", "ckpt_tools.cli", "convert-dcp", str(step), "--output", str(out)],
            capture_output=True,
            text=True,
            env=launch_env(),
            cwd=REPO,
            timeout=120,
        )
    finally:
        other.kill()
        other.wait()
    assert proc.returncode == 4, proc.stderr
    assert [x for x in proc.stderr.splitlines() if x.strip()] == [
        f"error: {out} is in use by convert-dcp (process {other.pid} on {_host()}); one conversion per output"
        " directory at a time: wait for it to end"
    ], proc.stderr
    assert [p.name for p in out.iterdir()] == [LOCK_NAME]  # nothing of the refused conversion


def test_the_shards_are_kept_when_the_verified_output_was_replaced_before_the_delete(
    step: Path, tmp_path: Path
) -> None:
    out = tmp_path / "converted"
    result = convert_dcp(step, output=out, verify=True, progress=False)  # verified; the delete comes later
    assert result.verified and result.deletion is not None
    # Meanwhile another conversion replaces the output (a bf16 one, with --overwrite).
    convert_dcp(step, output=out, dtype="bf16", overwrite=True, progress=False)
    with pytest.raises(WriteError, match=r"replaced since this conversion verified it .* DCP shards kept"):
        delete_converted_dcp(result)
    assert (step / L.PRETRAINED_MODEL_DIR / L.MODEL_DCP_DIR / ".metadata").is_file()


def _host() -> str:
    import socket

    return socket.gethostname()
