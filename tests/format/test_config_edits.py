"""A train_config.json edited after the save: named field by field, a warning when it changes the run.

Found by the differential harness: a resume from a config whose gradient clip, warm-up or
schedule was edited runs with the edits and ends elsewhere than the saved run would have,
while ``verify-resume`` said "RESUMABLE, no warnings". The record of the save's files keeps the
config as saved; the trainer and ``verify-resume`` name the change with one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckpt_tools.format import layout as L
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.rules import config_edits, save_files
from ckpt_tools.resume.verify import verify_resume
from devtools.training import step_dir
from tests.support.train_cli import run_in_process


def edited(run: Path, tmp_path: Path, **fields: object) -> StepPaths:
    dst = tmp_path / "run" / L.CHECKPOINTS_DIR / "000008"
    shutil.copytree(step_dir(run, 8), dst)
    paths = StepPaths(dst)
    doc = json.loads(paths.train_config.read_text())
    for dotted, value in fields.items():
        *groups, leaf = dotted.split("__")
        node = doc
        for group in groups:
            node = node[group]
        node[leaf] = value
    paths.train_config.write_text(json.dumps(doc))
    return paths


def test_the_rule_names_changed_leaves_and_ignores_places_and_reporting() -> None:
    saved = {"seed": 1, "log_freq": 1, "optimizer": {"grad_clip_norm": 10.0}, "dataset": {"root": "/a"}}
    now = {"seed": 1, "log_freq": 5, "optimizer": {"grad_clip_norm": 0.5}, "dataset": {"root": "/b"}, "x": 1}
    found = config_edits.changes(saved, now)
    assert [name for name, *_ in found] == ["log_freq", "optimizer.grad_clip_norm", "dataset.root", "x"]
    assert [name for name, *_ in config_edits.run_changes(found)] == ["optimizer.grad_clip_norm", "x"]
    assert config_edits.warning(saved, {**saved, "log_freq": 9}) is None


def test_an_edit_that_changes_the_run_is_a_warning_with_its_fields(runs: dict[str, Path], tmp_path: Path) -> None:
    paths = edited(runs["ddp"], tmp_path, optimizer__grad_clip_norm=0.01, log_freq=7)
    line = save_files.config_edit(paths)
    assert line is not None and "optimizer.grad_clip_norm 10.0 → 0.01" in line and "log_freq" not in line, line
    verdict = verify_resume(paths.root)
    assert verdict.resumable and ("config-edits", "warn", line) in [
        (c.name, c.status, c.message) for c in verdict.checks
    ]
    assert not verify_resume(paths.root, strict=True).resumable


def test_moving_the_dataset_or_renaming_the_run_is_no_warning(runs: dict[str, Path], tmp_path: Path) -> None:
    paths = edited(runs["ddp"], tmp_path, job_name="renamed", log_freq=3)
    assert save_files.config_edit(paths) is None
    assert "config-edits" not in [c.name for c in verify_resume(paths.root).checks]


@pytest.mark.torchrun
def test_the_trainer_prints_the_same_warning(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = edited(runs["ddp"], tmp_path, scheduler__warmup_steps=3)
    line = save_files.config_edit(paths)
    assert line is not None and "scheduler.warmup_steps 0 → 3" in line
    args = ("--resume=true", f"--config_path={paths.train_config}", f"--output_dir={tmp_path / 'out'}", "--steps=10")
    proc = run_in_process([*args, "--dry_run=true"], capsys)  # ends before any process group
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"warning: {line}" in proc.stdout.splitlines()
