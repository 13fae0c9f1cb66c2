"""A job killed (SIGKILL) in the middle of a checkpoint save loses nothing: ``last`` stays complete."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.procs import kill_tree
from tests.support.training import TINY, ok, script, step_dir, train

pytestmark = pytest.mark.torchrun

# Big enough that a save takes a noticeable fraction of a second on this disk.
MEDIUM = [a for a in TINY if not a.startswith(("--policy.dim_model", "--policy.dim_feedforward"))] + [
    "--policy.dim_model=512",
    "--policy.dim_feedforward=2048",
]


def kill_during_save(out: Path, args: list[str], timeout: float = 240) -> Path:
    """Start a 2-rank FSDP job, SIGKILL all of it while a save after the first one is in flight."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        script("ckpt-train"),
        *args,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = out / "checkpoints"
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            partials = [p for p in root.glob(".*.partial")] if (root / "last").exists() else []
            if partials:
                kill_tree(proc.pid)
                proc.wait()
                return partials[0]
            if proc.poll() is not None:
                break
            time.sleep(0.002)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
    raise AssertionError("the job ended before a second save could be interrupted")


def test_sigkill_mid_save_leaves_last_complete_and_resumable(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [
        *MEDIUM,
        "--steps=8",
        "--save_freq=2",
        "--parallelism.dp_shard=2",
        "--checkpoint_format=safetensors_dcp",
        f"--output_dir={out}",
    ]
    partial = kill_during_save(out, args)
    assert partial.exists(), "the kill landed after the commit; the save was not interrupted"
    root = out / "checkpoints"
    last = (root / "last").resolve()
    interrupted_step = int(partial.name.strip(".").removesuffix(".partial"))
    assert int(last.name) == interrupted_step - 2
    assert not (root / f"{interrupted_step:06d}").exists()  # never visible half-written
    # Every file of the previous checkpoint is complete: the tools agree and training resumes from it.
    for rel in (
        "pretrained_model/model.safetensors",
        "pretrained_model/pytorch_model_fsdp_0/.metadata",
        "training_state/optimizer_0/.metadata",
        "training_state/training_step.json",
    ):
        assert (last / rel).exists(), rel
    resumed = ok(
        train("--resume=true", f"--config_path={root / 'last'}", "--steps=" + str(int(last.name) + 2), nproc=2)
    )
    assert f"resumed from {last}" in resumed.stdout
    assert (root / "last").resolve() == step_dir(out, int(last.name) + 2)
    assert not partial.exists()  # the stale partial save was cleared when that step was saved again
