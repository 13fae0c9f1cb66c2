"""The generated model card: the run's facts, valid Hub metadata, and nothing private."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from ckpt_tools.errors import CheckpointError
from ckpt_tools.format import layout
from ckpt_tools.format.record import Topology
from ckpt_tools.hub import build_model_card, plan_publish
from ckpt_tools.hub.card import public_name
from tests.support.hub_data import make_step_dir


def _card(folder: Path, repo_id: str = "alice/act-pick-place", secrets: tuple[str, ...] = ()) -> str:
    return build_model_card(plan_publish(folder), repo_id=repo_id, secrets=secrets)


def _assert_no_local_paths(card: str, *paths: Path) -> None:
    for p in (*paths, Path.home()):
        assert str(p) not in card, f"{p} leaked into the card"
        assert str(p.resolve()) not in card


def test_card_states_the_run_from_train_config_and_training_step(tmp_path: Path) -> None:
    step = make_step_dir(tmp_path)
    card = _card(step.pretrained_model)
    data = ModelCard(card).data  # the Hub's own parser: the front matter is valid YAML metadata
    assert data.library_name == "lerobot"
    assert data.pipeline_tag == "robotics"
    assert data.tags == ["ckpt-tools", "robotics", "lerobot", "act"]
    assert data.datasets == ["alice/pick-place"]
    rows = dict(
        (cells[1].strip(), cells[2].strip())
        for line in card.splitlines()
        if line.startswith("| ") and (cells := line.split("|")) and len(cells) == 4
    )
    assert rows["Policy type"] == "`act`"
    assert rows["Dataset"] == "`alice/pick-place`"
    assert rows["Steps"] == "5000 of 5000 planned"
    assert rows["Batch"] == "effective batch 64 = batch_size 8 × dp_world_size 4 × grad_accum 2"
    assert rows["Layout"].startswith("HSDP over 2×2")
    assert rows["Precision"] == "bf16 mixed precision; published weights F32"
    assert rows["PEFT"] == "no (full weights)"
    assert rows["Checkpoint format"] == "safetensors_dcp (published: `model.safetensors`)"
    assert rows["Seed"] == "1000"
    assert "- `model.safetensors` (10.5 KiB)" in card  # 10 800 bytes
    _assert_no_local_paths(card, step.dataset_root, step.output_dir, tmp_path)


def test_without_training_step_the_layout_and_batch_come_from_the_config(tmp_path: Path) -> None:
    step = make_step_dir(tmp_path, with_training_step=False)
    card = _card(step.pretrained_model)
    assert "| Layout | HSDP over 2×2 (dp_replicate×dp_shard) |" in card
    assert "effective batch 64 = batch_size 8 × dp_world_size 4 × grad_accum 2" in card
    assert "| Steps | 5000 |" in card


def test_a_config_only_fsdp_mesh_reads_as_the_training_step_record_would(tmp_path: Path) -> None:
    step = make_step_dir(tmp_path, with_training_step=False)
    pm = step.pretrained_model
    config = json.loads((pm / layout.TRAIN_CONFIG).read_text())
    config["parallelism"] = {"dp_replicate": 1, "dp_shard": 4}
    (pm / layout.TRAIN_CONFIG).write_text(json.dumps(config))
    card = _card(pm)
    assert f"| Layout | {Topology(world_size=4, dp_replicate=1, dp_shard=4).describe()} |" in card
    assert "dp_world_size 4" in card


def test_peft_card_names_the_adapter_and_hides_a_local_base_model_path(tmp_path: Path) -> None:
    step = make_step_dir(tmp_path, peft=True)
    card = _card(step.pretrained_model)
    data = ModelCard(card).data
    assert "peft" in data.tags and "lora" in data.tags
    assert data.to_dict().get("base_model") is None  # a local path is not a Hub base model
    assert "| PEFT | LORA (r=8), base model `act_base (local path)` |" in card
    assert "PeftModel.from_pretrained" in card
    _assert_no_local_paths(card, tmp_path / "models" / "act_base", step.dataset_root, step.output_dir)


def test_a_hub_base_model_and_a_license_reach_the_metadata(tmp_path: Path) -> None:
    step = make_step_dir(tmp_path, peft=True)
    pm = step.pretrained_model
    adapter = json.loads((pm / layout.ADAPTER_CONFIG).read_text())
    adapter["base_model_name_or_path"] = "lerobot/act_base"
    (pm / layout.ADAPTER_CONFIG).write_text(json.dumps(adapter))
    config = json.loads((pm / layout.TRAIN_CONFIG).read_text())
    config["policy"]["license"] = "apache-2.0"
    (pm / layout.TRAIN_CONFIG).write_text(json.dumps(config))
    data = ModelCard(_card(pm)).data
    assert data.base_model == "lerobot/act_base"
    assert data.license == "apache-2.0"


def test_local_only_dataset_is_named_by_its_basename_and_not_listed(tmp_path: Path) -> None:
    step = make_step_dir(tmp_path)
    pm = step.pretrained_model
    config = json.loads((pm / layout.TRAIN_CONFIG).read_text())
    config["dataset"]["repo_id"] = None
    config["job_name"] = str(tmp_path / "jobs" / "x")  # any other field holding a path is masked too
    (pm / layout.TRAIN_CONFIG).write_text(json.dumps(config))
    card = _card(pm)
    assert "| Dataset | local dataset `my_local_pick_place (local path)` |" in card
    assert ModelCard(card).data.datasets is None
    _assert_no_local_paths(card, step.dataset_root, tmp_path)


def test_missing_or_sparse_train_config_still_gives_a_valid_card(tmp_path: Path) -> None:
    pm = make_step_dir(tmp_path).pretrained_model
    (pm / layout.TRAIN_CONFIG).write_text(json.dumps({"policy": {"type": "act"}, "steps": "many"}))
    sparse = _card(pm)
    assert ModelCard(sparse).data.tags == ["ckpt-tools", "robotics", "lerobot", "act"]
    (pm / layout.TRAIN_CONFIG).unlink()
    (pm.parent / layout.TRAINING_STATE_DIR / layout.TRAINING_STEP).unlink()
    bare = _card(pm)
    assert "| Policy type | `act` |" in bare  # from the policy's config.json
    assert "| Layout | unknown |" in bare


def test_malformed_training_step_is_one_clear_line(tmp_path: Path) -> None:
    step = make_step_dir(tmp_path)
    (step.training_state / layout.TRAINING_STEP).write_text("{not json")
    with pytest.raises(CheckpointError, match=r"training_step\.json: not valid JSON"):
        _card(step.pretrained_model)


def test_secrets_are_masked(tmp_path: Path) -> None:
    pm = make_step_dir(tmp_path).pretrained_model
    token = "hf_" + "9f" * 16
    config = json.loads((pm / layout.TRAIN_CONFIG).read_text())
    config["dataset"]["repo_id"] = f"alice/{token}"
    (pm / layout.TRAIN_CONFIG).write_text(json.dumps(config))
    card = _card(pm, secrets=(token,))
    assert token not in card and "alice/***" in card


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("alice/pick-place", "alice/pick-place"),
        ("act", "act"),
        ("/data/robots/pick_place", "pick_place (local path)"),
        ("~/datasets/pusht", "pusht (local path)"),
        ("./data/pusht", "pusht (local path)"),
        ("data/robots/pusht", "pusht (local path)"),
        ("C:\\Users\\me\\pusht", "pusht (local path)"),
    ],
)
def test_public_name(value: str, shown: str) -> None:
    assert public_name(value) == shown
