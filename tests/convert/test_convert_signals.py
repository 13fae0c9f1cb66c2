"""A conversion stopped by a closed terminal (SIGHUP) or Ctrl-\\ (SIGQUIT) leaves nothing behind.

Their default action ends the process without unwinding: the half-written temporaries stayed,
and a rerun with other flags (another ``--dtype``: other output names) never removed them.
Now both signals unwind like Ctrl-C; and a rerun removes any abandoned temporary of a
conversion output in its directory, whatever name it was for.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ckpt_tools.convert import convert_dcp
from ckpt_tools.io.dir_lock import LOCK_NAME
from ckpt_tools.io.fsutil import TEMP_SUFFIX
from devtools.procs import REPO, launch_env
from tests.support.dcp_fixtures import save_model_dcp


@pytest.fixture(scope="module")
def big_dcp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DCP shards large enough (128 MiB) that a conversion is still writing when the signal comes."""
    directory = tmp_path_factory.mktemp("big") / "dcp"
    rng = np.random.default_rng(0)
    save_model_dcp(
        directory, {f"layer{i}.weight": rng.standard_normal((2048, 4096), dtype=np.float32) for i in range(4)}
    )
    return directory


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT], ids=["SIGHUP", "SIGQUIT"])
def test_a_conversion_stopped_by_a_signal_leaves_no_temporary(big_dcp: Path, tmp_path: Path, sig: int) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckpt_tools.cli", "convert-dcp", str(big_dcp), "--output", str(out), "--quiet"],
        env=launch_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (out.is_dir() and any(p.name.endswith(TEMP_SUFFIX) for p in out.iterdir())):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the conversion never started writing"
        time.sleep(0.005)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err  # unwound as an interrupt
    assert "Traceback" not in err
    left = [p.name for p in out.iterdir()] if out.exists() else []
    assert left == [], left  # no temporary, no lock, no half output


def test_a_rerun_with_other_flags_removes_a_killed_conversions_temporaries(big_dcp: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    code = "import os, signal, sys\nfrom pathlib import Path\nfrom ckpt_tools.io.fsutil import TempSibling\n"
    code += "TempSibling(Path(sys.argv[1]))\nos.kill(os.getpid(), signal.SIGKILL)\n"
    killed = subprocess.run([sys.executable, "-c", code, str(out / "model.safetensors")], env=launch_env(), timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert len(list(out.iterdir())) == 1  # the fp32 conversion's temporary
    result = convert_dcp(big_dcp, output=out / "model-bf16.safetensors", dtype="bf16", progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["model-bf16.safetensors"]
    assert any("left by an interrupted conversion" in note for note in result.notes)
    assert not (out / LOCK_NAME).exists()  # released
