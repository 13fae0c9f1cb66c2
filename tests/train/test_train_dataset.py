"""The dataset by repo id through the Hugging Face cache (then offline), with LeRobot's command name."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from devtools.training import FIXTURE_DATASET, TINY, step_dir, train_command
from tests.support.hub_fixtures import HubEndpoint

pytestmark = pytest.mark.torchrun  # starts ckpt-train

FLAGS = [a for a in TINY if not a.startswith("--dataset.")] + ["--steps=1", "--save_freq=1"]


def ckpt_train(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = train_command(args)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_repo_id_resolves_through_the_cache_and_then_offline(hub: HubEndpoint, tmp_path: Path) -> None:
    files = {str(p.relative_to(FIXTURE_DATASET)): p.read_bytes() for p in FIXTURE_DATASET.rglob("*") if p.is_file()}
    hub.server.seed_repo("alice/tiny_robot", files, repo_type="dataset")
    online = ckpt_train(*FLAGS, "--dataset.repo_id=alice/tiny_robot", f"--output_dir={tmp_path / 'a'}", env=hub.env)
    assert online.returncode == 0, online.stderr[-2000:]
    cached = list((hub.hf_home / "hub").glob("datasets--alice--tiny_robot/snapshots/*/data/frames.safetensors"))
    assert len(cached) == 1 and cached[0].read_bytes() == (FIXTURE_DATASET / "data/frames.safetensors").read_bytes()
    hub.server.stop()  # nothing to reach any more: the cache must do
    offline = ckpt_train(
        *FLAGS,
        "--dataset.repo_id=alice/tiny_robot",
        f"--output_dir={tmp_path / 'b'}",
        env={**hub.env, "HF_HUB_OFFLINE": "1"},
    )
    assert offline.returncode == 0, offline.stderr[-2000:]
    assert (step_dir(tmp_path / "b", 1) / "pretrained_model/model.safetensors").exists()
    missing = ckpt_train(
        *FLAGS,
        "--dataset.repo_id=alice/not_cached",
        f"--output_dir={tmp_path / 'c'}",
        env={**hub.env, "HF_HUB_OFFLINE": "1"},
    )
    assert missing.returncode == 2
    assert (
        "error: --dataset.repo_id=alice/not_cached: not in the Hugging Face cache and HF_HUB_OFFLINE is set"
        in missing.stderr
    )
