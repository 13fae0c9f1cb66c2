"""Paths in a saved ``train_config.json`` mean the same from any directory.

The trainer records them absolute; an older trainer recorded them as typed, relative to the
directory it was launched from. Those are read relative to that directory as the run dir
shows it - never relative to the current directory, which says nothing about the checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckpt_tools.format.train_config import read_saved_config
from ckpt_tools.resume.plan import plan_reshard
from ckpt_tools.resume.verify import verify_resume
from devtools.training import FIXTURE_DATASET, step_dir


def older_run(runs: dict[str, Path], launch: Path) -> Path:
    """The DDP run as an older trainer saved it, launched from ``launch`` with relative flags.

    ``--output_dir=outputs/run --dataset.root=data/tiny_robot``, recorded as typed.
    """
    shutil.copytree(FIXTURE_DATASET, launch / "data" / "tiny_robot")
    run = launch / "outputs" / "run"
    shutil.copytree(runs["ddp"], run, symlinks=True)
    for config in run.glob("checkpoints/0*/pretrained_model/train_config.json"):
        doc = json.loads(config.read_text())
        doc["output_dir"], doc["dataset"]["root"] = "outputs/run", "data/tiny_robot"
        config.write_text(json.dumps(doc))
    return run


def test_relative_paths_of_an_older_checkpoint_are_read_from_its_run_not_the_cwd(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = tmp_path / "launch"
    run = older_run(runs, launch)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    config = read_saved_config(step_dir(run, 8) / "pretrained_model" / "train_config.json")
    assert config.dataset_root == str(launch / "data" / "tiny_robot")
    assert config.run_dir == run
    assert config.resume_base()["output_dir"] == str(run)
    report = verify_resume(run / "checkpoints", strict=True)
    assert report.resumable, [c for c in report.failures]
    dataset = next(c for c in report.checks if c.name == "dataset")
    assert dataset.message.startswith(f"--dataset.root={launch / 'data' / 'tiny_robot'} (3000 samples)")
    assert plan_reshard(run / "checkpoints").blockers == []  # not "cannot work"


def test_a_moved_run_reads_its_relative_paths_from_its_run_dir(runs: dict[str, Path], tmp_path: Path) -> None:
    """Moved away from where it was launched, the run dir no longer ends with the recorded output_dir."""
    moved = tmp_path / "moved"
    shutil.copytree(older_run(runs, tmp_path / "launch"), moved, symlinks=True)
    config = read_saved_config(step_dir(moved, 8) / "pretrained_model" / "train_config.json")
    assert config.run_dir == moved
    assert config.dataset_root == str(moved / "data" / "tiny_robot")
    failed = {c.name: c.message for c in verify_resume(moved / "checkpoints").failures}
    assert failed == {
        "dataset": f"--dataset.root={moved / 'data' / 'tiny_robot'}: no such directory - the resume"
        " cannot load its data"
    }


def test_a_config_outside_a_checkpoint_keeps_its_paths(tmp_path: Path) -> None:
    """``--config_path`` of a new run (or ``verify-resume --config``): read as the trainer reads flags."""
    path = tmp_path / "next.json"
    path.write_text(json.dumps({"output_dir": "out", "dataset": {"root": "data"}, "policy": {"type": "act"}}))
    config = read_saved_config(path)
    assert config.step is None and config.run_dir is None
    assert config.dataset_root == "data" and config.resolve("output_dir") == "out"
