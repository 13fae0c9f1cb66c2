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
from ckpt_tools.train.checkpoint.written_digests import WrittenDigests
from devtools.training import LEGACY_CHECKPOINT


def step_paths(tmp_path: Path) -> StepPaths:
    paths = StepPaths(tmp_path)
    paths.pretrained_model.mkdir()
    paths.training_state.mkdir()
    return paths


def test_every_part_of_the_manifest_has_a_writer(tmp_path: Path) -> None:
    record = TrainingStep(step=1)
    job = SaveJob(1, tmp_path, "000001", None, {}, {}, None, record, None, {}, {}, None, ())  # type: ignore[arg-type]
    writers = job._writers(StepPaths(tmp_path), None, WrittenDigests(tmp_path))  # type: ignore[arg-type]  # never run
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
    parts.save_scheduler_state(saved.state_dict(), paths, save_id="5f0c")  # stamped with its save
    restored = scheduler()
    parts.load_scheduler_state(restored, paths)
    assert restored.last_epoch == 3 and restored.get_last_lr() == saved.get_last_lr()
    assert not hasattr(restored, "save_id")  # the stamp is the file's, not the scheduler's


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


def _trained_adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(3, 2)).sum().backward()
    optimizer.step()
    return optimizer


def _as_json(value: object) -> object:
    import json

    return json.loads(json.dumps(value))


def _same_state(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert _as_json(sa["param_groups"]) == _as_json(sb["param_groups"])  # JSON holds betas as a list
    assert sa["state"].keys() == sb["state"].keys()
    for position, slots in sa["state"].items():
        assert slots.keys() == sb["state"][position].keys()
        for slot, value in slots.items():
            assert torch.equal(value, sb["state"][position][slot]), (position, slot)


@pytest.mark.parametrize("form", ["lerobot", "ckpt-train before"])
def test_flat_optimizer_state_loads_back_bit_exact_from_both_forms(tmp_path: Path, form: str) -> None:
    """ckpt-train writes LeRobot's form now, and still loads the files it wrote before."""
    import json

    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from ckpt_tools.format.record import Layout
    from ckpt_tools.train.checkpoint.state_dicts import write_flat_optimizer
    from ckpt_tools.train.parallel.wrap import ParallelModel

    paths = step_paths(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Linear(4, 1))
    saved = _trained_adamw(model)
    osd = get_optimizer_state_dict(model, saved)  # keyed by name, as the save job captures it
    if form == "lerobot":
        write_flat_optimizer(osd, paths.optimizer_state, paths.optimizer_param_groups)
        groups = json.loads(paths.optimizer_param_groups.read_text())
        assert groups == _as_json(saved.state_dict()["param_groups"])  # torch's own groups, key for key
    else:  # what ckpt-train wrote until it wrote LeRobot's form
        tensors = {f"state.{n}.{k}": v for n, slots in osd["state"].items() for k, v in slots.items()}
        save_file(tensors, str(paths.optimizer_state))
        paths.optimizer_param_groups.write_text(json.dumps({"param_groups": osd["param_groups"], "scalars": {}}))

    fresh = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Linear(4, 1))
    loaded = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    parts.load_flat_optimizer(ParallelModel(fresh, fresh, Layout.DDP, 1, 1), loaded, paths)
    _same_state(saved, loaded)


def test_lerobot_form_without_names_is_refused_in_one_line(tmp_path: Path) -> None:
    """A file LeRobot wrote numbers its parameters and names none: ckpt-train cannot place its state."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from ckpt_tools.format.record import Layout
    from ckpt_tools.train.checkpoint.state_dicts import write_flat_optimizer
    from ckpt_tools.train.parallel.wrap import ParallelModel

    paths = step_paths(tmp_path)
    model = torch.nn.Linear(2, 1)
    write_flat_optimizer(
        get_optimizer_state_dict(model, _trained_adamw(model)), paths.optimizer_state, paths.optimizer_param_groups
    )
    with safe_open(str(paths.optimizer_state), "pt") as f:
        assert set(f.metadata()) == {"format", "ckpt_tools.param_names"}  # AdamW: no non-tensor slot
    save_file(load_file(str(paths.optimizer_state)), str(paths.optimizer_state))  # as LeRobot saves it
    with pytest.raises(CheckpointError, match="names none") as refused:
        parts.load_flat_optimizer(
            ParallelModel(model, model, Layout.DDP, 1, 1), torch.optim.AdamW(model.parameters()), paths
        )
    assert "\n" not in str(refused.value)
