"""DDP, FSDP2 and HSDP under real torchrun (gloo, CPU): training, layout files, exactness.

Three launches, shared by every test in this module (torchrun costs seconds each).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from devtools.training import (
    assert_tensors_equal,
    dcp_to_dict,
    gathered_weights,
    losses,
    step_dir,
)

pytestmark = pytest.mark.torchrun


def test_loss_goes_down_in_every_layout(runs: dict[str, Path]) -> None:
    for name, out in runs.items():
        values = losses(out)
        assert len(values) == 8, name
        assert sum(values[-3:]) / 3 < sum(values[:3]) / 3, f"{name}: {values}"


def test_fsdp_fp32_losses_equal_ddp(runs: dict[str, Path]) -> None:
    assert losses(runs["fsdp"]) == losses(runs["ddp"])


SIDE_FILES = [
    "pretrained_model/config.json",
    "pretrained_model/train_config.json",
    "pretrained_model/policy_preprocessor.json",
    "pretrained_model/policy_preprocessor_step_0_normalizer_processor.safetensors",
    "pretrained_model/policy_postprocessor.json",
    "pretrained_model/policy_postprocessor_step_0_normalizer_processor.safetensors",
    "training_state/rng_state.safetensors",
    "training_state/scheduler_state.json",
    "training_state/training_step.json",
]


@pytest.mark.parametrize(
    "name, present, absent",
    [
        (
            "ddp",
            [
                "pretrained_model/model.safetensors",
                "training_state/optimizer_state.safetensors",
                "training_state/optimizer_param_groups.json",
            ],
            ["pretrained_model/pytorch_model_fsdp_0", "training_state/optimizer_0", "training_state/scaler_state.json"],
        ),
        (
            "fsdp",
            [
                "pretrained_model/model.safetensors",
                "pretrained_model/pytorch_model_fsdp_0/.metadata",
                "training_state/optimizer_0/.metadata",
            ],
            ["training_state/optimizer_state.safetensors", "training_state/optimizer_param_groups.json"],
        ),
        (
            "hsdp",
            ["pretrained_model/pytorch_model_fsdp_0/.metadata", "training_state/optimizer_0/.metadata"],
            ["pretrained_model/model.safetensors", "training_state/optimizer_state.safetensors"],
        ),
    ],
)
def test_layout_files(runs: dict[str, Path], name: str, present: list[str], absent: list[str]) -> None:
    root = runs[name] / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["000004", "000008", "last"]
    assert (root / "last").resolve() == (root / "000008").resolve()
    for step in (4, 8):
        d = step_dir(runs[name], step)
        for rel in SIDE_FILES + present:
            assert (d / rel).exists(), f"{name}: {rel} missing"
        for rel in absent:
            assert not (d / rel).exists(), f"{name}: {rel} should not exist"
    record = json.loads((step_dir(runs[name], 8) / "training_state/training_step.json").read_text())
    expected = {"ddp": (2, 2, 1), "fsdp": (2, 1, 2), "hsdp": (4, 2, 2)}[name]
    topo = record["topology"]
    assert (topo["world_size"], topo["dp_replicate"], topo["dp_shard"]) == expected
    assert record["step"] == 8 and record["sharded"] == (name != "ddp")
    assert record["samples_seen"] == 8 * record["batch_size"] * record["dp_world_size"]


def test_gathered_weights_are_fp32_and_equal_the_shards(runs: dict[str, Path], tmp_path: Path) -> None:
    full = gathered_weights(runs["fsdp"], 8)
    assert all(t.dtype == torch.float32 for t in full.values())
    shards = dcp_to_dict(step_dir(runs["fsdp"], 8) / "pretrained_model/pytorch_model_fsdp_0", tmp_path)
    assert list(shards) == ["model"]
    assert_tensors_equal(full, shards["model"])
    with safe_open(str(step_dir(runs["ddp"], 8) / "pretrained_model/model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(full)


def test_accelerate_merge_weights_reads_our_shards(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "merged"
    shard_dir = step_dir(runs["fsdp"], 8) / "pretrained_model/pytorch_model_fsdp_0"
    from accelerate.utils import merge_fsdp_weights  # what `accelerate merge-weights` runs
    from safetensors.torch import load_file

    merge_fsdp_weights(str(shard_dir), str(out), safe_serialization=True)

    assert_tensors_equal(load_file(str(out / "model.safetensors")), gathered_weights(runs["fsdp"], 8))


def test_optimizer_shards_use_accelerate_key(runs: dict[str, Path], tmp_path: Path) -> None:
    osd = dcp_to_dict(step_dir(runs["hsdp"], 8) / "training_state/optimizer_0", tmp_path)
    assert list(osd) == ["optimizer"]
    state = osd["optimizer"]["state"]
    assert "encoder.layers.0.linear1.weight" in state
    assert set(state["encoder.layers.0.linear1.weight"]) == {"step", "exp_avg", "exp_avg_sq"}


def test_each_rank_reads_its_own_slice_of_one_global_order(runs: dict[str, Path]) -> None:
    from devtools.training import sample_log

    for name in ("ddp", "hsdp"):
        log = sample_log(runs[name])
        world = len(log)
        per_step = [idx for step in range(1, 9) for rank in range(world) for idx in log[rank][step]]
        assert len(per_step) == len(set(per_step)), f"{name}: a sample repeated within the epoch"
    # The same global order, whatever the topology: DDP 2×8 and HSDP 4×4 consume the same 16 per step.
    ddp, hsdp = sample_log(runs["ddp"]), sample_log(runs["hsdp"])
    for step in range(1, 9):
        assert ddp[0][step] + ddp[1][step] == [i for r in range(4) for i in hsdp[r][step]]


def test_banner_and_saved_config(runs: dict[str, Path]) -> None:
    banner = (runs["hsdp"].parent / "hsdp.stdout").read_text()
    assert "HSDP over 2×2 (dp_replicate×dp_shard)" in banner
    assert "effective batch 16 = batch_size 4 × dp_world_size 4 × grad_accum 1" in banner
    assert "--optimizer.lr=0.004" in banner  # the linear-scaling suggestion, never applied
    assert banner.count("ckpt-train: policy act") == 1  # printed by the main rank only
    config = json.loads((step_dir(runs["hsdp"], 4) / "pretrained_model/train_config.json").read_text())
    assert config["parallelism"] == {"dp_replicate": 2, "dp_shard": 2}
    assert config["policy"]["state_dim"] == 14 and config["policy"]["type"] == "act"
