"""The trainer's pre-flight, one function for ``ckpt-train --dry_run=true`` and ``verify-resume``.

Two resumes that used to be called resumable and then failed once running: a dataset whose
features give the policy other sizes (exit 2 after the process group), and a config whose model
no longer fits the saved weights (exit 3 in the load). For each, the dry run, the real resume
and ``verify-resume`` must give the same line; and a dry run writes nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ckpt_tools.format import layout as L
from ckpt_tools.format.rules import load_plan
from ckpt_tools.resume.verify import verify_resume
from devtools.procs import REPO
from devtools.training import TINY, step_dir, train
from tests.support.cli import invoke_cli
from tests.support.train_cli import run_in_process


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line.removeprefix("error: ") for line in proc.stderr.splitlines() if line.startswith("error: ")]


def copied_step(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run" / L.CHECKPOINTS_DIR / "000008"
    shutil.copytree(step_dir(run, 8), dst)
    return dst


def test_the_load_plan_rule() -> None:
    model = {"a.weight": (4, 2), "a.bias": (4,)}
    assert load_plan.problems(model, dict(model), strict=True) == []
    assert load_plan.problems(model, {**model, "b": (1,)}, strict=False) == []  # a DCP load reads what it asks for
    found = load_plan.problems(model, {"a.weight": (4, 3), "b": (1,)}, strict=True)
    assert found == [
        "the model the config builds has 1 tensor (a.bias) that the checkpoint does not hold",
        "a.weight is [4, 3] in the checkpoint, [4, 2] in the model the config and dataset build",
        "the checkpoint holds 1 tensor (b) that the model the config builds does not have",
    ]


def test_a_dry_run_checks_everything_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "new"
    # A dry run ends before any process group: the entry point runs in this process.
    proc = run_in_process([*TINY, f"--output_dir={out}", "--steps=4", "--dry_run=true"], capsys)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("  pass")]
    assert names == ["world", "dataset-loads", "policy-builds"]
    assert f"this launch would start a run in {out} (nothing was written)" in proc.stdout
    assert not out.exists()


@pytest.mark.torchrun
def test_a_dataset_of_other_sizes_is_one_line_for_the_dry_run_the_resume_and_verify(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tmp_path / "six_joints"
    made = subprocess.run(
        [str(REPO / "bin" / "make-dataset"), f"--out={dataset}", "--episodes=4", "--frames=60", "--joints=6"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    step = copied_step(runs["ddp"], tmp_path)
    config = step / L.PRETRAINED_MODEL_DIR / L.TRAIN_CONFIG
    doc = json.loads(config.read_text())
    doc["dataset"]["root"] = str(dataset)  # the edit a moved dataset gets (train_config.json is the user's)
    config.write_text(json.dumps(doc))
    args = ("--resume=true", f"--config_path={config}", f"--output_dir={tmp_path / 'out'}", "--steps=10")

    dry = run_in_process([*args, "--dry_run=true"], capsys)
    real = train(*args, timeout=120)
    assert (dry.returncode, real.returncode) == (2, 2), (dry.stderr[-2000:], real.stderr[-2000:])
    line = "--policy.state_dim=14 does not match the dataset (12)"
    assert error_lines(dry) == error_lines(real) == [line]
    verdict = verify_resume(step, build=True)
    assert not verdict.resumable
    assert [(c.name, c.message) for c in verdict.failures] == [("policy-builds", line)]


@pytest.mark.torchrun
def test_weights_that_do_not_fit_the_configured_model_are_one_line_everywhere(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one_process = ("--parallelism.dp_replicate=1", "--parallelism.dp_shard=1", "--checkpoint_format=safetensors")
    for name in ("ddp", "hsdp"):  # the gathered file (a strict load), the DCP shards
        step = copied_step(runs[name], tmp_path / name)
        config = step / L.PRETRAINED_MODEL_DIR / L.TRAIN_CONFIG
        doc = json.loads(config.read_text())
        doc["policy"]["dim_feedforward"] = 48  # was 64: every feed-forward weight changes shape
        config.write_text(json.dumps(doc))
        args = ("--resume=true", f"--config_path={config}", f"--output_dir={tmp_path / name / 'out'}", "--steps=10")
        args += one_process if name == "hsdp" else ()

        dry = run_in_process([*args, "--dry_run=true"], capsys)
        assert dry.returncode == 3, (name, dry.stderr[-2000:])
        if name == "ddp":  # the real resume stops on the same line (its load calls the same rule)
            real = train(*args, timeout=120)
            assert real.returncode == 3 and error_lines(dry) == error_lines(real), (name, real.stderr[-2000:])
        (line,) = error_lines(dry)
        assert "its weights do not fit the model: encoder.layers.0.linear1.weight is [64, 32]" in line, line
        shown = json.loads(invoke_cli("verify-resume", str(step), "--json").stdout)  # the command builds by default
        assert [(c["name"], c["message"]) for c in shown["checks"] if c["status"] == "fail"] == [("load-plan", line)]
        skipped = json.loads(invoke_cli("verify-resume", str(step), "--json", "--skip-build").stdout)
        assert "load-plan" not in [c["name"] for c in skipped["checks"]], name
