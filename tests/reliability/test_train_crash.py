"""A job killed (SIGKILL) in the middle of a checkpoint save loses nothing: ``last`` stays complete."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.training import MEDIUM, kill_during_save, ok, step_dir, train

pytestmark = pytest.mark.torchrun


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
