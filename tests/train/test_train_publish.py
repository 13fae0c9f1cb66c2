"""End of training: ``--policy.repo_id`` publishes to a loopback Hub; trackio records metrics."""

from __future__ import annotations

import json
import shlex
import sqlite3
from pathlib import Path

import pytest

from devtools.procs import run_cli
from devtools.training import TINY, metrics, ok, step_dir, train
from tests.support.hub_fixtures import HubEndpoint, assert_token_absent, hf_download
from tests.train.test_train_startup import refused_in_process


def test_sharded_dcp_run_publishes_converted_weights(hub: HubEndpoint, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = ok(
        train(
            *TINY,
            "--steps=2",
            "--save_freq=2",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=dcp",
            "--policy.repo_id=alice/act-fsdp",
            "--policy.private=true",
            f"--output_dir={out}",
            nproc=2,
            env=hub.env,
        )
    )
    assert proc.stdout.count("published the final policy to") == 1
    local = step_dir(out, 2) / "pretrained_model"
    sent = hub.server.files("alice/act-fsdp")
    assert "model.safetensors" in sent and "README.md" in sent
    sent.pop(".gitattributes", None)  # created with the repo, as on the Hub
    assert not any("distcp" in name or "training_state" in name or name.startswith(".") for name in sent)
    for name, data in sent.items():
        if name not in ("README.md", "train_config.json"):
            assert (local / name).read_bytes() == data, name
    # train_config.json is a copy with its local paths (the dataset, the output dir) set to null.
    assert json.loads(sent["train_config.json"])["dataset"]["root"] is None
    assert (
        hf_download(hub.env, "alice/act-fsdp", "model.safetensors").read_bytes()
        == (local / "model.safetensors").read_bytes()
    )
    card = sent["README.md"].decode()
    assert "FSDP" in card and str(tmp_path) not in card
    assert_token_absent(hub.token, [out], [proc.stdout, proc.stderr])


def test_failed_upload_keeps_the_checkpoint_and_its_retry_works(hub: HubEndpoint, tmp_path: Path) -> None:
    out = tmp_path / "run"
    hub.server.faults.fail("create_repo", 500, times=1)
    flags = ["--steps=2", "--save_freq=2", "--policy.repo_id=alice/act", "--policy.private=true"]
    proc = train(*TINY, *flags, f"--output_dir={out}", env=hub.env)
    assert proc.returncode == 5
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "retry with: ckpt-tools push" in errors[0] and "Traceback" not in proc.stderr
    assert (step_dir(out, 2) / "pretrained_model/model.safetensors").exists()
    assert_token_absent(hub.token, [out], [proc.stdout, proc.stderr])
    # The retry the line names publishes what the run would have, private as asked.
    retry = shlex.split(errors[0].split("retry with: ", 1)[1])
    assert retry[:2] == ["ckpt-tools", "push"]
    again = run_cli(*retry[1:], env=hub.env, no_torch=True)
    assert again.returncode == 0, again.stderr
    assert hub.server.repo("alice/act").private
    sent = hub.server.files("alice/act")
    assert sent["model.safetensors"] == (step_dir(out, 2) / "pretrained_model/model.safetensors").read_bytes()


def test_bad_repo_id_is_refused_before_training(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused_in_process([*TINY, "--policy.repo_id=not a repo", f"--output_dir={tmp_path / 'x'}"], capsys)
    assert "--policy.repo_id" in line and not (tmp_path / "x").exists()


def test_trackio_records_reduced_metrics_of_a_two_process_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {"TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HOME": str(tmp_path / "hf")}
    ok(
        train(
            *TINY,
            "--steps=3",
            "--save_freq=3",
            "--trackio.enable=true",
            "--job_name=tk",
            f"--output_dir={out}",
            nproc=2,
            env=env,
        )
    )
    db = sqlite3.connect(tmp_path / "trackio" / "tk.db")
    rows = db.execute("select step, metrics from metrics order by step").fetchall()
    logged = {step: json.loads(m) for step, m in rows}
    local = {m["step"]: m for m in metrics(out)}
    assert sorted(logged) == [1, 2, 3]
    for step, tracked in logged.items():
        assert tracked["loss"] == local[step]["loss"]  # the cross-rank mean, logged once
    config = json.loads(db.execute("select config from configs").fetchone()[0])
    assert config["steps"] == 3 and config["trackio"]["enable"] is True
