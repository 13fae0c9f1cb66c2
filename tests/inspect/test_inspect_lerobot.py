"""``inspect`` on checkpoints LeRobot wrote (main and 0.6.1, every layout): healthy, with the topology they record."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_tools.inspect import inspect_path
from tests.support.lerobot_fixtures import all_runs, main_run, run_id, v061_run

TOPOLOGY = {
    "main/single": "SINGLE over 1 process (training_step.json parallelism)",
    "main/single-cosine": "SINGLE over 1 process (training_step.json parallelism)",
    "main/ddp": "DDP over 2 processes (training_step.json parallelism)",
    "main/fsdp-dcp": "FSDP over 2 shards (training_step.json parallelism)",
    "main/fsdp-safetensors_dcp": "FSDP over 2 shards (training_step.json parallelism)",
    "main/hsdp-dcp": "HSDP over 2×2 (dp_replicate×dp_shard) (training_step.json parallelism)",
    "v0_6_1/single": "SINGLE over 1 process (num_processes 1; optimizer state keyed by position)",
    "v0_6_1/single-cosine": "SINGLE over 1 process (num_processes 1; optimizer state keyed by position)",
    "v0_6_1/ddp": "DDP over 2 processes (num_processes 2; optimizer state keyed by position)",
    "v0_6_1/fsdp": "FSDP over 2 shards (num_processes 2; optimizer state keyed by parameter name)",
}


@pytest.mark.parametrize("run", all_runs(), ids=run_id)
def test_every_lerobot_checkpoint_is_healthy_with_its_topology(run: Path) -> None:
    report = inspect_path(run / "checkpoints")
    assert report.healthy, [f"{c.name}: {c.message}" for c in report.checks if c.failed]
    assert report.topology == TOPOLOGY[run_id(run)]
    assert report.batch is not None and report.batch.startswith("effective batch")
    every_step = [s for s in report.steps]
    assert every_step and all(s.healthy for s in every_step)
    assert any("samples_seen" in n and "LeRobot's rule" in n for n in report.notes)
    assert any(n.startswith("written by LeRobot") for n in report.notes)


def test_a_dcp_only_lerobot_checkpoint_needs_no_flat_files() -> None:
    # LeRobot main, checkpoint_format=dcp: pytorch_model_fsdp_0/ + optimizer_0/, no model.safetensors,
    # no optimizer_state.safetensors, no scheduler_state.json (ACT: no scheduler).
    report = inspect_path(main_run("fsdp-dcp") / "checkpoints" / "last")
    assert report.formats == ["dcp", "dcp optimizer"]
    assert report.training_step is not None and report.training_step["checkpoint_format"] == "dcp"
    assert any(c.name == "pretrained_model/pytorch_model_fsdp_0 ranks" and c.status == "pass" for c in report.checks)


def test_the_0_6_fsdp_layout_warns_that_current_lerobot_cannot_resume_it() -> None:
    report = inspect_path(v061_run("fsdp") / "checkpoints" / "last")
    warned = [c.message for c in report.checks if c.name == "resumable layout"]
    assert report.healthy and report.legacy
    assert warned and "LeRobot 0.6.x FSDP" in warned[0] and "lerobot-train --policy.path=" in warned[0]
    assert not [c for c in inspect_path(v061_run("ddp") / "checkpoints").checks if c.name.endswith("resumable layout")]
