"""The training core's half of the manifest, in-process: every part has a writer, and each
save/load pair of ``parts.py`` reads back what it wrote."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ckpt_tools.errors import CheckpointError, LegacyCheckpoint
from ckpt_tools.format import manifest
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.peft_keys import saved_adapter_key
from ckpt_tools.format.record import Topology, TrainingStep
from ckpt_tools.train.checkpoint import parts
from ckpt_tools.train.checkpoint.save_job import SaveJob
from devtools.training import LEGACY_CHECKPOINT


def step_paths(tmp_path: Path) -> StepPaths:
    paths = StepPaths(tmp_path)
    paths.pretrained_model.mkdir()
    paths.training_state.mkdir()
    return paths


def test_every_part_of_the_manifest_has_a_writer(tmp_path: Path) -> None:
    record = TrainingStep(step=1)
    job = SaveJob(1, tmp_path, "000001", None, {}, {}, None, record, None, {}, {}, None, ())  # type: ignore[arg-type]
    writers = job._writers(StepPaths(tmp_path), None)  # type: ignore[arg-type]  # built, never run
    assert set(writers) == {part.key for part in manifest.PARTS}


def test_scheduler_state_round_trip(tmp_path: Path) -> None:
    paths = step_paths(tmp_path)

    def scheduler() -> torch.optim.lr_scheduler.LambdaLR:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)

    saved = scheduler()
    for _ in range(3):
        saved.optimizer.step()
        saved.step()
    parts.save_scheduler_state(saved.state_dict(), paths)
    restored = scheduler()
    parts.load_scheduler_state(restored, paths)
    assert restored.last_epoch == 3 and restored.get_last_lr() == saved.get_last_lr()


def test_scaler_state_round_trip_and_a_missing_one(tmp_path: Path) -> None:
    paths = step_paths(tmp_path)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with pytest.raises(CheckpointError, match=r"scaler_state\.json: missing; --accelerator\.mixed_precision=fp16"):
        parts.load_scaler_state(scaler, paths)
    parts.save_scaler_state({**scaler.state_dict(), "scale": 64.0}, paths)
    parts.load_scaler_state(scaler, paths)
    assert scaler.state_dict()["scale"] == 64.0


def test_training_step_round_trip_and_the_resumability_refusal(tmp_path: Path) -> None:
    paths = step_paths(tmp_path)
    record = TrainingStep(step=4, samples_seen=32, topology=Topology(2, 2, 1), sharded=False)
    parts.save_training_step(record, paths)
    assert parts.load_training_step(paths).samples_seen == 32
    with pytest.raises(LegacyCheckpoint, match=r"0\.6\.x-era checkpoint"):
        parts.load_training_step(StepPaths(LEGACY_CHECKPOINT))


def test_adapter_names_load_back_onto_the_live_parameters() -> None:
    live = {"base_model.model.x.lora_A.default.weight", "base_model.model.head.modules_to_save.default.weight"}
    saved = {saved_adapter_key(k): torch.zeros(1) for k in live}
    assert set(parts.peft_keys_to_model_keys(saved, live)) == live
    with pytest.raises(CheckpointError, match="which the current PEFT model does not have"):
        parts.peft_keys_to_model_keys({"base_model.model.y.lora_A.weight": torch.zeros(1)}, live)


@pytest.mark.parametrize("groups", ['{"param_groups": 3}', '{"param_groups": [{"lr": 0.1}]}', "[1, 2]", "{"])
def test_a_malformed_param_groups_file_is_the_same_line_for_the_trainer_and_verify_resume(
    tmp_path: Path, groups: str
) -> None:
    from safetensors.torch import save_file

    from ckpt_tools.format.record import Layout
    from ckpt_tools.resume.checks.state import _optimizer
    from ckpt_tools.resume.source import load_source
    from ckpt_tools.train.checkpoint.state_dicts import write_flat_optimizer
    from ckpt_tools.train.parallel.wrap import ParallelModel

    paths = step_paths(tmp_path)
    model = torch.nn.Linear(2, 2)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(paths.model_weights))
    parts.save_training_step(TrainingStep(step=1, samples_seen=8, topology=Topology(1, 1, 1), sharded=False), paths)
    osd = {
        "state": {"weight": {"exp_avg": torch.zeros(2, 2), "exp_avg_sq": torch.zeros(2, 2), "step": torch.tensor(1.0)}},
        "param_groups": [{"params": ["weight", "bias"], "lr": 0.1}],
    }
    write_flat_optimizer(osd, paths.optimizer_state, paths.optimizer_param_groups)
    paths.optimizer_param_groups.write_text(groups)

    parallel = ParallelModel(model, model, Layout.DDP, 1, 1)
    with pytest.raises(CheckpointError) as trainer:
        parts.load_flat_optimizer(parallel, torch.optim.AdamW(model.parameters()), paths)
    checks = {c.name: c for c in _optimizer(load_source(paths))}
    assert checks["optimizer-coverage"].status == "fail"
    assert checks["optimizer-coverage"].message == str(trainer.value)
    assert str(trainer.value).startswith(f"{paths.optimizer_param_groups}: ")
