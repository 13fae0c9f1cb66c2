"""``convert-dcp --push-to-hub``: publish only after a verified conversion; delete shards only after the push.

Uses the loopback Hub of tests/fakes/hub/server.py with the real huggingface_hub client.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from devtools.procs import run_cli, script
from devtools.training import step_dir
from tests.support.cli import invoke_cli
from tests.support.dcp_fixtures import FSDP2_STEP, copy_tree, tree_digest
from tests.support.hub_fixtures import HubEndpoint


def test_seed_alias_pushes_then_deletes_the_shards(ckpts: Path, tmp_path: Path, hub: HubEndpoint) -> None:
    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "000010")
    proc = subprocess.run(
        [
            script("lerobot-convert-dcp"),
            f"--checkpoint_dir={step}",
            "--delete_dcp=true",
            f"--push_to_hub={hub.user}/tiny",
            "--quiet=true",
        ],
        env=hub.env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    pm = step / "pretrained_model"
    assert not (pm / "pytorch_model_fsdp_0").exists()
    uploaded = hub.server.files(f"{hub.user}/tiny")
    assert uploaded["model.safetensors"] == (pm / "model.safetensors").read_bytes()
    assert not any("distcp" in name or name.startswith("pytorch_model_fsdp_0") for name in uploaded)
    assert hub.token not in proc.stdout + proc.stderr


def test_failed_push_keeps_shards_and_converted_files(ckpts: Path, tmp_path: Path, hub: HubEndpoint) -> None:
    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "000010")
    shards = tree_digest(step / "pretrained_model" / "pytorch_model_fsdp_0")
    hub.server.faults.fail("create_repo", 500, times=10)
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_tools.cli", "convert-dcp", str(step), "--delete-dcp", "--push-to-hub", "alice/x"],
        env={**hub.env, "CKPT_TOOLS_HUB_TIMEOUT": "20"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 5, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr
    assert tree_digest(step / "pretrained_model" / "pytorch_model_fsdp_0") == shards
    assert (step / "pretrained_model" / "model.safetensors").is_file()  # converted and verified, kept


def test_bad_repo_id_is_refused_before_any_work(ckpts: Path, tmp_path: Path) -> None:
    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "000010")
    before = tree_digest(step)
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_tools.cli", "convert-dcp", str(step), "--push-to-hub", "not a repo"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--push-to-hub" in proc.stderr
    assert tree_digest(step) == before


def test_the_retry_a_failed_push_promises_is_the_same_command(
    runs: dict[str, Path], tmp_path: Path, hub: HubEndpoint
) -> None:
    """A real dcp-format checkpoint: push fails after the conversion; the same command then converts
    nothing again (the output verifies as its own), publishes, and only then deletes the shards."""
    step = copy_tree(step_dir(runs["hsdp"], 8), tmp_path / "checkpoints" / "000008")
    pm = step / "pretrained_model"
    command = ["convert-dcp", str(step), "--delete-dcp", "--push-to-hub", "alice/act-hsdp", "--quiet"]
    hub.server.faults.fail("create_repo", 500, times=10)
    failed = run_cli(*command, env={**hub.env, "CKPT_TOOLS_HUB_TIMEOUT": "20"}, no_torch=True)
    assert failed.returncode == 5, failed.stderr
    assert f"retry the push alone with: ckpt-tools push {pm} --repo-id alice/act-hsdp" in failed.stderr, failed.stderr
    converted = (pm / "model.safetensors").read_bytes()
    assert (pm / "pytorch_model_fsdp_0" / ".metadata").is_file()  # kept: nothing was published
    # Another conversion under the same name is refused, naming why - never kept, never replaced.
    other = invoke_cli("convert-dcp", str(step), "--dtype", "bf16", "--push-to-hub", "alice/act-hsdp", "--quiet")
    assert other.returncode == 2 and "already exists and is not exactly what this conversion writes" in other.stderr
    hub.server.faults.clear()
    retried = run_cli(*command, env=hub.env, no_torch=True)
    assert retried.returncode == 0, retried.stderr
    assert "kept the existing model.safetensors" in retried.stdout and "deleted" in retried.stdout
    assert (pm / "model.safetensors").read_bytes() == converted
    assert hub.server.files("alice/act-hsdp")["model.safetensors"] == converted
    assert not (pm / "pytorch_model_fsdp_0").exists()
