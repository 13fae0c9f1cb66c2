"""``ckpt-tools verify-resume`` as CI runs it: no torch, PASS/WARN/FAIL lines, JSON, exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from devtools.procs import run_cli
from devtools.training import LEGACY_CHECKPOINT, step_dir
from tests.support.cli import invoke_cli


def test_resumable_checkpoint_human_output(runs: dict[str, Path]) -> None:
    proc = run_cli("verify-resume", str(runs["hsdp"] / "checkpoints"), no_torch=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("verify-resume ") and lines[0].endswith("(step 8)")
    marks = [line.split()[0] for line in lines[2:-1]]
    assert set(marks) == {"PASS"} and len(marks) >= 12
    # Names are padded to one column, so the messages start at one column.
    width = max(len(line.split()[1]) for line in lines[2:-1])
    assert {line[8 + width : 8 + width + 2] for line in lines[2:-1]} == {"  "}
    assert all(line[8 + width + 2] != " " for line in lines[2:-1])
    assert lines[-1] == "resumable"


def test_warnings_pass_unless_strict(runs: dict[str, Path]) -> None:
    args = ["verify-resume", str(runs["hsdp"]), "--nproc", "2", "--dp-replicate", "1", "--dp-shard", "2"]
    relaxed = run_cli(*args, no_torch=True)
    assert relaxed.returncode == 0, relaxed.stderr
    assert "WARN  data-order" in relaxed.stdout and relaxed.stdout.splitlines()[-1] == "resumable (2 warnings)"
    strict = invoke_cli(*args, "--strict", "--json")
    assert strict.returncode == 1
    doc = json.loads(strict.stdout)
    assert doc["strict"] and not doc["resumable"]
    assert {c["name"] for c in doc["checks"] if c["status"] == "warn"} == {"data-order", "effective-batch"}


def test_broken_checkpoint_fails_with_json(runs: dict[str, Path], tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints" / "000004"
    shutil.copytree(step_dir(runs["fsdp"], 4), ckpt)
    (ckpt / "training_state/rng_state.safetensors").unlink()
    proc = run_cli("verify-resume", str(ckpt / "pretrained_model"), "--json", no_torch=True)
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["resumable"] is False and doc["step"] == 4
    assert [c["name"] for c in doc["checks"] if c["status"] == "fail"] == ["rng-state"]
    human = invoke_cli("verify-resume", str(ckpt))
    assert "FAIL  rng-state" in human.stdout and human.stdout.splitlines()[-1] == "NOT RESUMABLE: 1 check failed"


def test_config_flag_and_legacy(runs: dict[str, Path], tmp_path: Path) -> None:
    config = json.loads((step_dir(runs["fsdp"], 4) / "pretrained_model/train_config.json").read_text())
    config["parallelism"] = {"dp_replicate": 2, "dp_shard": 2}
    next_run = tmp_path / "train_config.json"
    next_run.write_text(json.dumps(config))
    proc = run_cli("verify-resume", str(runs["fsdp"]), "--config", str(next_run), "--json", no_torch=True)
    assert proc.returncode == 0, proc.stdout
    assert json.loads(proc.stdout)["target"].startswith("HSDP over 2×2")
    legacy = invoke_cli("verify-resume", str(LEGACY_CHECKPOINT))
    assert legacy.returncode == 1 and "FAIL  layout" in legacy.stdout and "a 0.6.x-era checkpoint" in legacy.stdout


def test_bad_input_is_one_line(runs: dict[str, Path], tmp_path: Path) -> None:
    cases = [
        (["verify-resume", str(tmp_path / "nothing")], 3, "no such file or directory"),
        (["verify-resume", str(runs["fsdp"]), "--config", str(tmp_path / "none.json")], 3, "none.json: missing"),
        (["verify-resume", str(runs["fsdp"]), "--dp-shard", "0"], 2, "--dp-shard=0"),
        (["verify-resume", str(runs["fsdp"]), "--mixed-precision", "fp8"], 2, "--mixed-precision=fp8"),
    ]
    # Every case in-process through the same app, the first also as a real process without torch.
    checks = [(invoke_cli(*args), args, code, text) for args, code, text in cases]
    checks.append((run_cli(*cases[0][0], no_torch=True), *cases[0]))
    for proc, args, code, text in checks:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == code, (args, proc.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], (args, proc.stderr)
    helptext = run_cli("verify-resume", "--help", no_torch=True).stdout
    assert "Examples:" in helptext and "--strict" in helptext and "Exit codes" in helptext


def test_inspect_and_verify_resume_name_the_same_checkpoint_step_and_topology(runs: dict[str, Path]) -> None:
    """One shape: a script reads `checkpoint`, `step` and `topology` from either command's JSON, for any path form."""
    run = runs["fsdp"]
    for path in (run / "checkpoints" / "last", run / "checkpoints", run / "checkpoints/last/pretrained_model", run):
        inspected = json.loads(invoke_cli("inspect", str(path), "--json").stdout)
        verified = json.loads(invoke_cli("verify-resume", str(path), "--json").stdout)
        assert {k: inspected[k] for k in ("checkpoint", "step", "topology")} == {
            "checkpoint": str((run / "checkpoints" / "000008").resolve()),
            "step": 8,
            "topology": "FSDP over 2 shards, 1 node",
        }, path
        assert {k: verified[k] for k in ("checkpoint", "step", "topology")} == {
            k: inspected[k] for k in ("checkpoint", "step", "topology")
        }, path
    legacy = [json.loads(invoke_cli(c, str(LEGACY_CHECKPOINT), "--json").stdout) for c in ("inspect", "verify-resume")]
    assert legacy[0]["topology"] == legacy[1]["topology"] and legacy[0]["topology"].startswith("unknown: 0.6.x-era")
    assert legacy[0]["step"] == legacy[1]["step"] is not None
