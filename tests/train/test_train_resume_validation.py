"""The trainer's resume refuses a DCP checkpoint ``inspect`` calls unhealthy, with the line ``inspect`` gives.

Each class of damage that torch's DCP loader takes without a word (another run's shard read
through a storage path, a tensor missing its last chunk, an int32 archive where ``.metadata``
says float32, overlapping chunks) is applied to a real trainer-written FSDP checkpoint;
``inspect`` must fail it with reason R, and ``ckpt-train --resume=true`` must exit 3 printing
``error: R`` before torch's load reads a byte. The trainer's check itself is also tested
in-process, on both the model and the optimizer directory.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ckpt_tools.errors import CorruptCheckpoint
from ckpt_tools.format import layout as L
from ckpt_tools.inspect import inspect_path
from ckpt_tools.train.checkpoint.safe_dcp import require_valid_dcp_inputs
from devtools.training import step_dir, train
from tests.support import dcp_damage as damage
from tests.support.save_record import without_save_record

WEIGHT = "model.state_proj.weight"  # [128, 14], rows split over the two FSDP ranks
MOMENT = "optimizer.state.state_proj.weight.exp_avg"

# What is damaged where, and how: (the DCP directory inside the step dir, the damage).
CLASSES: dict[str, tuple[str, Callable[[Path, Path], str]]] = {
    "storage path outside the checkpoint": (
        f"{L.PRETRAINED_MODEL_DIR}/{L.MODEL_DCP_DIR}",
        lambda d, tmp: damage.shard_of_another_run(d, tmp / "another_run" / L.MODEL_DCP_DIR),
    ),
    "tensor missing its last chunk": (
        f"{L.PRETRAINED_MODEL_DIR}/{L.MODEL_DCP_DIR}",
        lambda d, tmp: damage.drop_last_chunk(d, WEIGHT),
    ),
    "int32 archive where .metadata says float32": (
        f"{L.PRETRAINED_MODEL_DIR}/{L.MODEL_DCP_DIR}",
        lambda d, tmp: damage.int32_chunk(d, WEIGHT),
    ),
    "overlapping chunks (optimizer)": (
        f"{L.TRAINING_STATE_DIR}/{L.OPTIMIZER_DCP_DIR}",
        lambda d, tmp: damage.overlapping_chunks(d, MOMENT),
    ),
}


@pytest.mark.torchrun
@pytest.mark.parametrize("name", list(CLASSES))
def test_resume_stops_with_the_reason_inspect_gives(runs: dict[str, Path], tmp_path: Path, name: str) -> None:
    step = tmp_path / "run" / "checkpoints" / "000008"
    shutil.copytree(step_dir(runs["fsdp"], 8), step)
    without_save_record(step)  # the DCP checks hold for every producer's checkpoint, not only recorded ones
    where, apply = CLASSES[name]
    reason = apply(step / where, tmp_path)

    report = inspect_path(step)
    assert not report.healthy
    assert [c.message for c in report.checks if c.failed] == [reason]

    out = tmp_path / "resumed"
    proc = train(
        "--resume=true",
        f"--config_path={step}/{L.PRETRAINED_MODEL_DIR}/{L.TRAIN_CONFIG}",
        f"--output_dir={out}",
        "--parallelism.dp_shard=1",
        "--checkpoint_format=safetensors",
        "--steps=10",
        timeout=240,
    )
    assert proc.returncode == 3, (proc.stdout[-2000:], proc.stderr[-4000:])
    assert "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [f"error: {reason}"], proc.stderr
    assert not (out / "resume_audit").exists()  # refused before torch's load ran


# ---------------------------------------------------------------------- the trainer's check, in-process


def test_the_trainer_checks_the_optimizer_before_the_model_is_loaded(tmp_path: Path) -> None:
    step = L.StepPaths(tmp_path / "000004")
    damage.write_dcp(step.model_dcp, {"model.w": torch.ones(6, 2)})
    damage.write_dcp(step.optimizer_dcp, {"optimizer.state.w.exp_avg": torch.ones(6, 2)})
    require_valid_dcp_inputs(step)  # both sound
    reason = damage.drop_last_chunk(step.optimizer_dcp, "optimizer.state.w.exp_avg")
    with pytest.raises(CorruptCheckpoint) as raised:
        require_valid_dcp_inputs(step)
    assert str(raised.value) == reason
    assert [c.message for c in inspect_path(step.optimizer_dcp).checks if c.failed] == [reason]


def test_the_trainer_skips_a_dcp_dir_the_loader_does_not_read(tmp_path: Path) -> None:
    """No ``.metadata``: the loader falls back to the safetensors files (or says none is there)."""
    step = L.StepPaths(tmp_path / "000004")
    damage.write_dcp(step.model_dcp, {"model.w": torch.ones(6, 2)})
    damage.drop_last_chunk(step.model_dcp, "model.w")
    (step.model_dcp / L.DCP_METADATA).unlink()
    require_valid_dcp_inputs(step)
