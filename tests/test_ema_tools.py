"""The tools on EMA weights LeRobot wrote (fixtures/lerobot/main/single-ema, ``lerobot-train --ema.enable=true``).

``ema_state.pt`` read through the restricted unpickler (the trainer's reader too), ``inspect``
reporting the EMA weights and failing on a shadow that does not fit the model, ``push --ema``
to the loopback Hub, and the trainer's refusal of LeRobot's checkpoint. No job is launched.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckpt_tools.errors import CheckpointError, UnsafeCheckpoint
from ckpt_tools.facts.ema_state import read_ema_state
from ckpt_tools.format.ema import EmaSchedule
from ckpt_tools.train.ema import EmaShadow, read_lerobot_state
from ckpt_tools.train.parsing import parse_train_config
from devtools.procs import run_cli
from tests.support.cli import invoke_cli
from tests.support.hub_fixtures import HubEndpoint
from tests.support.lerobot_fixtures import main_run

STEP = main_run("single-ema") / "checkpoints" / "000004"
REPO = "alice/act-ema"


def test_lerobots_ema_state_reads_as_torch_load_reads_it() -> None:
    path = STEP / "training_state" / "ema_state.pt"
    saved = read_ema_state(path)
    assert (saved.optimization_step, len(saved.tensors), saved.names) == (4, 61, None)
    reference = torch.load(path, weights_only=True)["shadow_params"]
    model = torch.nn.Module()
    for i, t in enumerate(reference):  # the shadow's owner: one parameter per saved tensor, in order
        model.register_parameter(f"p{i}", torch.nn.Parameter(torch.zeros_like(t)))
    full, step = read_lerobot_state(path, EmaShadow(model, EmaSchedule()))
    assert step == 4
    assert all(torch.equal(full[f"p{i}"], t) for i, t in enumerate(reference))


def test_an_ema_state_naming_other_code_is_refused_unrun(tmp_path: Path) -> None:
    path = tmp_path / "ema_state.pt"
    torch.save({"shadow_params": [torch.ones(2)], "optimization_step": 1, "hook": subprocess.Popen}, path)
    with pytest.raises(UnsafeCheckpoint) as refused:
        read_ema_state(path)
    assert "refused to load global" in str(refused.value) and "Popen" in str(refused.value)
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    with pytest.raises(CheckpointError):
        read_ema_state(tmp_path / "junk.pt")


def test_inspect_reports_lerobots_ema_healthy() -> None:
    result = invoke_cli("inspect", str(STEP), "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["healthy"], result.stdout
    ema = report["ema"]
    assert ema["consistent"] and ema["updates"] == 4
    forms = {f["form"]: f for f in ema["forms"]}
    assert forms["safetensors"]["tensors"] == 62 and forms["ema_state.pt"]["tensors"] == 61
    assert forms["ema_state.pt"]["bytes"] == 139420
    line = next(c["message"] for c in report["checks"] if c["name"] == "ema")
    assert line.startswith("EMA weights after 4 updates in safetensors (62 tensors")


def _copy_step(tmp_path: Path) -> Path:
    step = tmp_path / "checkpoints" / "000004"
    shutil.copytree(STEP, step)
    return step


def test_inspect_fails_on_an_ema_tensor_missing_or_misshapen(tmp_path: Path) -> None:
    step = _copy_step(tmp_path)
    ema_file = step / "pretrained_model_ema" / "model.safetensors"
    weights = load_file(ema_file)
    dropped = sorted(weights)[0]
    save_file({k: v for k, v in weights.items() if k != dropped}, ema_file)
    result = invoke_cli("inspect", str(step))
    assert result.returncode == 1
    assert f"FAIL ema: pretrained_model_ema: no EMA tensor for 1 live tensor(s), first {dropped}" in result.stdout
    weights[dropped] = torch.zeros(3, 3)
    save_file(weights, ema_file)
    result = invoke_cli("inspect", str(step), "--json")
    line = next(c["message"] for c in json.loads(result.stdout)["checks"] if c["name"] == "ema")
    assert result.returncode == 1 and line.startswith(f"pretrained_model_ema: {dropped} is [3, 3], the live model's")


def test_convert_ema_on_lerobots_gathered_ema_says_there_is_nothing_to_convert() -> None:
    result = invoke_cli("convert-dcp", str(STEP), "--ema")
    assert result.returncode == 3
    assert "the EMA weights are already in safetensors form" in result.stderr


def test_push_ema_publishes_the_ema_policy(hub: HubEndpoint) -> None:
    proc = run_cli("push", str(STEP), "--ema", "--repo-id", REPO, "--json", env=hub.env, no_torch=True)
    assert proc.returncode == 0, proc.stderr
    files = hub.server.files(REPO)
    ema_dir = STEP / "pretrained_model_ema"
    assert files["model.safetensors"] == (ema_dir / "model.safetensors").read_bytes()
    assert files["model.safetensors"] != (STEP / "pretrained_model" / "model.safetensors").read_bytes()
    assert files["config.json"] == (ema_dir / "config.json").read_bytes()
    refused = run_cli("push", str(main_run("single")), "--ema", "--repo-id", REPO, env=hub.env, no_torch=True)
    assert refused.returncode == 3
    assert refused.stderr.strip().endswith(
        "holds no EMA weights (no pretrained_model_ema/: saved without --ema.enable)"
    )


def test_ckpt_train_refuses_lerobots_ema_checkpoint_as_lerobots() -> None:
    with pytest.raises(CheckpointError) as refused:
        parse_train_config(["--resume=true", f"--config_path={STEP}", "--ema.enable=true"])
    assert "LeRobot" in str(refused.value) and "\n" not in str(refused.value)
