"""``bin/gpu-check`` on CPU: the script users run on a GPU machine, here on gloo with a tiny model.

Its figures are not asserted (this machine is noisy and has no GPU); what must hold is that
the whole path runs - sync, async and no-save runs, a resume, the comparisons, the tools and
the staging probe - and that the verdicts are the good ones, so that the first run on a real
GPU fails only for something the GPU path does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.procs import REPO

# bin/gpu-check starts ckpt-train under torchrun from its own process, which the lane scan of
# tests/support/lanes.py cannot see: marked by hand.
pytestmark = pytest.mark.torchrun

CHECKED_RUNS = ("sync", "async", "resumed")


def test_gpu_check_passes_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # CPU even on a machine with GPUs: what CI runs
    proc = subprocess.run(
        [sys.executable, str(REPO / "bin" / "gpu-check"), "--size", "small", "--out", str(out), "--timeout", "240"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"STDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr[-4000:]}"
    report = json.loads((out / "gpu-check.json").read_text())
    assert report["passed"] and report["failures"] == []
    assert report["bit_identical"] is True and report["async_equals_sync"] is True
    assert "| resumed run bit-identical to the uninterrupted one (step 9) | yes |" in proc.stdout
    assert "| result | PASS |" in proc.stdout
    assert (out / "gpu-check.md").read_text().strip() == proc.stdout.strip()

    verdicts = {(t["command"], t["target"]): t["verdict"] for t in report["tools"]}
    assert verdicts == {
        **{("inspect", run): "healthy" for run in CHECKED_RUNS},
        **{("verify-resume", run): "resumable" for run in CHECKED_RUNS},
        ("convert-dcp", "sync"): "converted",
    }
    assert all(t["returncode"] == 0 for t in report["tools"])

    # The figures come from the trainer's own reports: every save, every phase of the resume.
    assert report["world"].startswith("2 processes, FSDP2 over 2 shards")
    assert sorted(report["sync_pause_s"]) == sorted(report["async_pause_s"]) == ["3", "6", "9"]
    assert sorted(report["async_stage_s"]) == ["3", "6"]  # the final save has no update to wait before
    assert set(report["loop_s"]) == set(report["wall_s"]) == {"sync", "async", "nosave"}
    assert report["step_s"] > 0 and report["parameters"] > 0
    assert report["resume"]["start_to_first_step_s"] > 0
    assert list(report["resume"]["phases_s"]) == ["imports", "process_group", "build", "load"]
    # CPU tensors are staged as before this check existed: plain host buffers, an exact copy.
    assert report["staging"]["pinned"] is False and report["staging"]["exact"] is True
