"""What a resume reads and where it writes: one step's parts, the run the checkpoint is in, nothing overwritten.

The rules are tested as functions in tests/format/; here the trainer applies them: its config
records absolute paths, a resume of a copied run writes into the copy, and it refuses - before
it writes anything - a checkpoint whose parts are from different steps and a resume that would
save over newer checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from ckpt_tools.resume.plan import plan_reshard
from ckpt_tools.resume.target import TargetRequest
from ckpt_tools.resume.verify import verify_resume
from devtools.training import FIXTURE_DATASET, TINY, step_dir, train
from tests.support.run_copy import copy_run
from tests.support.save_record import without_save_record
from tests.support.train_cli import run_in_process

pytest.importorskip("torch")


def fingerprint(run: Path) -> dict[str, str]:
    """Every file under the run's checkpoints/ and where ``last`` points: what must not change."""
    root = run / "checkpoints"
    out = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}
    out["last ->"] = os.readlink(root / "last")
    return out


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


# ---------------------------------------------------------------------- the config (in process)


def test_the_trainer_records_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_tools.train.config import train_config_dict
    from ckpt_tools.train.parsing import parse_train_config

    monkeypatch.chdir(tmp_path)
    relative_root = os.path.relpath(FIXTURE_DATASET, tmp_path)
    flags = [a for a in TINY if not a.startswith("--dataset.root")]
    cfg, _ = parse_train_config([*flags, f"--dataset.root={relative_root}", "--output_dir=outputs/run"])
    saved = train_config_dict(cfg)  # what train_config.json holds
    assert saved["output_dir"] == str(tmp_path / "outputs" / "run")
    assert saved["dataset"]["root"] == str(FIXTURE_DATASET)


def test_the_resume_of_a_copied_run_writes_into_the_copy(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckpt_tools.train.parsing import parse_train_config

    original = copy_run(runs["ddp"], tmp_path / "original")
    copy = tmp_path / "copy"
    shutil.copytree(original, copy, symlinks=True)  # its configs still name the original
    cfg, step = parse_train_config(["--resume=true", f"--config_path={copy / 'checkpoints' / 'last'}"])
    assert step == (copy / "checkpoints" / "000008").resolve()
    assert cfg.output_dir == str(copy)
    monkeypatch.chdir(tmp_path)
    cfg, _ = parse_train_config(["--resume=true", "--config_path=copy/checkpoints/last", "--output_dir=third"])
    assert cfg.output_dir == str(tmp_path / "third")  # a flag is relative to the current directory
    assert not cfg.overwrite_checkpoints  # never carried over from the saved config


def test_resuming_a_run_that_reached_its_steps_has_nothing_to_do(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One line, exit 0, before any process group - and nothing written: no audit, no metrics, no checkpoint."""
    from tests.support.train_cli import exits_in_process

    run = copy_run(runs["ddp"], tmp_path / "run")
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    for extra in ([], ["--steps=4"]):  # at --steps, and past it
        out, err = exits_in_process(
            ["--resume=true", f"--config_path={run / 'checkpoints' / 'last'}", *extra], capsys, 0
        )
        steps = extra[0].split("=")[1] if extra else "8"
        assert out == (
            f"nothing to do: the run is at step 8 and --steps={steps} ({step_dir(run, 8)} holds it);"
            " pass --steps above 8 to train further\n"
        )
        assert not err
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before


# ---------------------------------------------------------------------- the trainer (one launch each)


def test_resuming_a_copied_run_leaves_the_original_alone(runs: dict[str, Path], tmp_path: Path) -> None:
    original = copy_run(runs["ddp"], tmp_path / "original")
    before = fingerprint(original)
    copy = tmp_path / "copy"
    shutil.copytree(original, copy, symlinks=True)
    proc = train("--resume=true", f"--config_path={copy / 'checkpoints' / 'last'}", "--steps=9")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning: resuming step" not in proc.stdout  # it writes into the run the checkpoint is in
    assert (copy / "checkpoints" / "000009").is_dir() and os.readlink(copy / "checkpoints" / "last") == "000009"
    assert fingerprint(original) == before


def test_a_checkpoint_whose_parts_are_from_different_steps_is_refused(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(runs["ddp"], tmp_path / "run")
    record = step_dir(run, 8) / "training_state" / "training_step.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "step": 0}))  # the reported case
    without_save_record(step_dir(run, 8))  # the step counters refuse it on their own (a LeRobot-like copy)
    before = fingerprint(run)
    proc = run_in_process(
        ["--resume=true", f"--config_path={run / 'checkpoints' / 'last'}"], capsys
    )  # before any process group
    lines = error_lines(proc.stderr)
    assert proc.returncode == 3 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"error: {record}: step 0, in step directory 000008")
    assert lines[0].endswith("it cannot be resumed")
    assert fingerprint(run) == before  # nothing re-saved over 000004 and 000008


def test_a_resume_from_an_older_step_refuses_to_save_over_newer_ones(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(runs["ddp"], tmp_path / "run")
    before = fingerprint(run)
    proc = run_in_process(["--resume=true", f"--config_path={step_dir(run, 4)}"], capsys)  # before any process group
    lines = error_lines(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"error: --output_dir={run}: holds checkpoints after step 4 (000008)")
    assert "--overwrite_checkpoints=true" in lines[0]
    assert fingerprint(run) == before
    # The tools predict the same refusal, with the same line, and what the flag changes.
    verdict = verify_resume(step_dir(run, 4))
    assert not verdict.resumable and [f"error: {c.message}" for c in verdict.failures if c.name == "output"] == lines
    assert "output" in [c.name for c in plan_reshard(step_dir(run, 4)).blockers]
    assert verify_resume(step_dir(run, 4), TargetRequest(overwrite_checkpoints=True)).resumable
    assert verify_resume(step_dir(run, 4), TargetRequest(output_dir=tmp_path / "elsewhere")).resumable


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("file/run", "exists and is not a directory"),
        ("file", "exists and is not a directory"),
        ("x" * 300, "name too long"),
    ],
    ids=["under a file", "a file", "a name too long"],
)
def test_an_output_dir_that_cannot_be_one_is_refused_at_start_up(tmp_path: Path, output: str, expected: str) -> None:
    from ckpt_tools.errors import ConfigError
    from ckpt_tools.train.parsing import parse_train_config

    (tmp_path / "file").write_text("not a directory")
    cfg, _ = parse_train_config([*TINY, f"--output_dir={tmp_path / output}"])
    with pytest.raises(ConfigError, match=expected):
        cfg.validate()
