"""The optimizer and scheduler values a resume takes from the checkpoint agree with its config.

torch's loads apply whatever these state files hold: before the rule, an edited
``scheduler_state.json`` or param group (on a checkpoint without a record of its save's files,
whose digests would refuse it first) or a changed ``--optimizer.lr`` on the resume command line
was called resumable, and the resume then ran with values nobody asked for, or stopped with a
traceback steps later. Each variant is a real trainer checkpoint changed in one value; the rule
is checked where it is decided and through ``verify-resume`` and the trainer, which must give
the same line.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckpt_tools.facts import saved_hyperparameters
from ckpt_tools.format import layout as L
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.train_config import read_saved_config
from ckpt_tools.resume.verify import verify_resume
from devtools.training import step_dir
from tests.support.save_record import without_save_record
from tests.support.train_cli import run_in_process

Edit = Callable[[dict[str, Any]], None]


def _set(key: str, value: object) -> Edit:
    return lambda doc: doc.__setitem__(key, value)


def _group(key: str, value: object) -> Edit:
    return lambda doc: doc[0].__setitem__(key, value)


# name -> (file under training_state/, edit, what the line names)
EDITS: dict[str, tuple[str, Edit, str]] = {
    "base lr": (L.SCHEDULER_STATE, _set("base_lrs", [0.5]), "base_lrs 0.5"),
    "lambda object": (L.SCHEDULER_STATE, _set("lr_lambdas", [1]), "lr_lambdas [1]"),
    "count as text": (L.SCHEDULER_STATE, _set("_step_count", "9"), "_step_count '9' is not a count"),
    "nan lr": (L.SCHEDULER_STATE, _set("_last_lr", [float("nan")]), "_last_lr [nan]"),
    "unknown key": (L.SCHEDULER_STATE, _set("optimizer", None), "unknown key 'optimizer'"),
    "weight decay": (L.OPTIMIZER_PARAM_GROUPS, _group("weight_decay", 0.5), "weight_decay 0.5"),
    "betas": (L.OPTIMIZER_PARAM_GROUPS, _group("betas", [0.1, 0.2]), "betas [0.1, 0.2]"),
    "amsgrad": (L.OPTIMIZER_PARAM_GROUPS, _group("amsgrad", True), "amsgrad True"),
    "group lr": (L.OPTIMIZER_PARAM_GROUPS, _group("lr", 0.25), "lr 0.25, the saved scheduler's last lr"),
}


def edited_step(run: Path, tmp_path: Path, what: str) -> StepPaths:
    dst = tmp_path / "run" / L.CHECKPOINTS_DIR / "000008"
    shutil.copytree(step_dir(run, 8), dst)
    paths = StepPaths(without_save_record(dst))
    name, edit, _ = EDITS[what]
    file = paths.training_state / name
    doc = json.loads(file.read_text())
    edit(doc)
    file.write_text(json.dumps(doc))
    return paths


def settings(paths: StepPaths) -> Any:
    return read_saved_config(paths.train_config).run_settings()


def test_every_checkpoint_the_trainer_writes_agrees_with_its_config(runs: dict[str, Path]) -> None:
    for name, run in runs.items():  # flat param groups (ddp), DCP param groups (fsdp, hsdp)
        for number in (4, 8):
            paths = StepPaths(step_dir(run, number))
            assert saved_hyperparameters.problems(paths, settings(paths)) == [], (name, number)


@pytest.mark.parametrize("what", list(EDITS))
def test_an_edited_value_is_refused_by_verify_resume_with_the_rules_line(
    runs: dict[str, Path], tmp_path: Path, what: str
) -> None:
    paths = edited_step(runs["ddp"], tmp_path, what)
    line = saved_hyperparameters.mismatch(paths, settings(paths))
    assert line is not None and EDITS[what][2] in line, line
    verdict = verify_resume(paths.root)
    assert not verdict.resumable
    assert [c.message for c in verdict.failures if c.name == "hyperparameters"] == [line]


def test_the_dcp_param_groups_are_read_and_judged(runs: dict[str, Path], tmp_path: Path) -> None:
    """A config that differs from the state in the shards (the next run's config, given to verify-resume)."""
    paths = StepPaths(step_dir(runs["fsdp"], 8))
    config = json.loads(paths.train_config.read_text())
    config["optimizer"]["weight_decay"] = 0.5
    other = tmp_path / "train_config.json"
    other.write_text(json.dumps(config))
    line = saved_hyperparameters.mismatch(paths, read_saved_config(other).run_settings())
    assert line is not None and "weight_decay 0.0001, the config gives 0.5" in line, line
    verdict = verify_resume(paths.root, config=other)
    assert [c.message for c in verdict.failures if c.name == "hyperparameters"] == [line]


@pytest.mark.torchrun
def test_the_trainer_refuses_with_the_same_line_before_any_process_group(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both ways a value can disagree: an edited file, and a changed flag on the resume command line.

    The refusal comes before any process group, so the trainer's entry point runs in this process.
    """
    paths = edited_step(runs["ddp"], tmp_path, "weight decay")
    line = saved_hyperparameters.mismatch(paths, settings(paths))
    args = ("--resume=true", f"--config_path={paths.train_config}", f"--output_dir={tmp_path / 'out'}", "--steps=10")
    proc = run_in_process(list(args), capsys)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert [x for x in proc.stderr.splitlines() if x.strip()] == [f"error: {line}"], proc.stderr

    fsdp = StepPaths(step_dir(runs["fsdp"], 8))
    proc = run_in_process([args[0], f"--config_path={fsdp.train_config}", *args[2:], "--optimizer.lr=0.5"], capsys)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "base_lrs 0.001, the config's --optimizer.lr is 0.5" in proc.stderr, proc.stderr
