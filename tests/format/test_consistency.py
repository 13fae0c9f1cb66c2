"""Every part of a checkpoint belongs to its step: the consistency rule on real trainer checkpoints.

Each variant is a copy of a step the training core wrote, with one part taken from another
step - what a hand-made copy, a half-restored backup or a mixed-up sync leaves. Without the
rule each of them loads without an error and continues from a state that never existed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckpt_tools.facts import consistency as counters_of
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.record import read_training_step
from ckpt_tools.format.rules import consistency
from devtools.training import step_dir

CONTAINERS = {"ddp": "training_state/optimizer_state.safetensors", "fsdp": "training_state/optimizer_0"}


def copy_step(run: Path, step: int, tmp_path: Path) -> StepPaths:
    dst = tmp_path / "run" / "checkpoints" / f"{step:06d}"
    shutil.copytree(step_dir(run, step), dst)
    return StepPaths(dst)


def take_from(step: StepPaths, other: Path, part: str) -> None:
    """Replace ``part`` of ``step`` with the one of the step dir ``other``."""
    target = step.root / part
    if target.is_dir():
        shutil.rmtree(target)
        shutil.copytree(other / part, target)
    else:
        shutil.copyfile(other / part, target)


def edit_record(paths: StepPaths, **changes: object) -> None:
    """Change fields of the step's training_step.json (None: remove the field)."""
    doc = json.loads(paths.training_step.read_text())
    for key, value in changes.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    paths.training_step.write_text(json.dumps(doc))


def reason(step: StepPaths) -> str | None:
    return counters_of.inconsistency(step, read_training_step(step.training_step))


def test_every_checkpoint_the_trainer_writes_is_from_one_step(runs: dict[str, Path]) -> None:
    for name, run in runs.items():
        for number in (4, 8):
            step = StepPaths(step_dir(run, number))
            record = read_training_step(step.training_step)
            assert record.adam_step == number, name  # the trainer records the optimizer's own count
            counters = counters_of.read_counters(step, record)
            assert consistency.problems(counters) == [], name
            assert counters.adam is not None and set(counters.adam.steps.values()) == {float(number)}
            assert counters.scheduler is not None and counters.scheduler["last_epoch"] == number
            assert consistency.describe(counters).startswith(f"step {number}: record, directory name, Adam step (")


def test_a_record_naming_another_step_than_its_directory(runs: dict[str, Path], tmp_path: Path) -> None:
    step = copy_step(runs["ddp"], 8, tmp_path)
    edit_record(step, step=0)  # the reported case: "step": 0 inside a step dir of a later step
    found = reason(step) or ""
    assert found.startswith(f"{step.training_step}: step 0, in step directory 000008")
    assert found.endswith("the parts of this checkpoint are not from one step; it cannot be resumed")


@pytest.mark.parametrize("name", sorted(CONTAINERS))  # flat optimizer_state.safetensors, DCP optimizer_0/
def test_optimizer_state_of_an_earlier_step(runs: dict[str, Path], tmp_path: Path, name: str) -> None:
    step = copy_step(runs[name], 8, tmp_path)
    take_from(step, step_dir(runs[name], 4), CONTAINERS[name])
    found = reason(step) or ""
    assert found.startswith(f"{step.root / CONTAINERS[name]}: Adam step 4 (")
    assert "training_step.json says 8 (step 8): the optimizer state is from another step" in found


def test_scheduler_state_of_an_earlier_step(runs: dict[str, Path], tmp_path: Path) -> None:
    step = copy_step(runs["hsdp"], 8, tmp_path)
    take_from(step, step_dir(runs["hsdp"], 4), "training_state/scheduler_state.json")
    found = reason(step) or ""
    assert found.startswith(f"{step.scheduler_state}: last_epoch 4, step 8 needs 8")


def test_a_record_of_an_older_trainer_bounds_the_optimizer_by_its_updates(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """Without ``adam_step`` only an optimizer ahead of the record is told apart (an fp16 run's Adam may lag)."""
    ahead = copy_step(runs["fsdp"], 4, tmp_path / "ahead")
    take_from(ahead, step_dir(runs["fsdp"], 8), CONTAINERS["fsdp"])
    edit_record(ahead, adam_step=None)
    assert "Adam step 8 (" in (reason(ahead) or "") and "more than the 4 optimizer updates" in (reason(ahead) or "")
    behind = copy_step(runs["fsdp"], 8, tmp_path / "behind")
    take_from(behind, step_dir(runs["fsdp"], 4), CONTAINERS["fsdp"])
    edit_record(behind, adam_step=None)
    assert reason(behind) is None


def test_a_record_that_contradicts_itself(runs: dict[str, Path], tmp_path: Path) -> None:
    step = copy_step(runs["ddp"], 8, tmp_path)
    edit_record(step, optimizer_steps=9)
    assert f"{step.training_step}: 9 optimizer updates in 8 steps" in (reason(step) or "")
    step = copy_step(runs["ddp"], 4, tmp_path / "sampler")
    record = json.loads(step.training_step.read_text())
    edit_record(step, sampler={**record["sampler"], "offset": record["sampler"]["offset"] + 16})
    assert "the sampler is at sample 80 (epoch 0, offset 80 of 3000), samples_seen says 64" in (reason(step) or "")


def test_several_disagreements_are_one_line(runs: dict[str, Path], tmp_path: Path) -> None:
    step = copy_step(runs["ddp"], 8, tmp_path)
    edit_record(step, step=4)  # directory, Adam step and scheduler now all disagree with it
    found = reason(step) or ""
    assert "\n" not in found and found.startswith(f"{step.training_step}: step 4, in step directory 000008 (+")
