"""One resolver from any path a user types to the step dir, and every tool (and the trainer) using it.

Each user path form - the run's output dir, ``checkpoints/``, a step dir, ``last``,
``pretrained_model/``, ``train_config.json``, ``training_state/`` - is tried against every
command that reads a checkpoint, in-process: they all land on the same step directory.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from ckpt_tools.convert import convert_dcp
from ckpt_tools.errors import CheckpointError, UsageError
from ckpt_tools.format import layout
from ckpt_tools.hub import plan_publish, resolve_publish_folder
from ckpt_tools.resume.plan import plan_reshard
from ckpt_tools.resume.target import TargetRequest
from ckpt_tools.resume.verify import verify_resume
from tests.support.dcp_fixtures import save_model_dcp
from tests.support.hub_data import StepDir, make_step_dir, weights

FORMS: dict[str, Callable[[StepDir], Path]] = {
    "run dir": lambda s: s.output_dir,
    "checkpoints/": lambda s: s.checkpoints,
    "step dir": lambda s: s.root,
    "last": lambda s: s.checkpoints / layout.LAST_LINK,
    "pretrained_model/": lambda s: s.pretrained_model,
    "train_config.json": lambda s: s.pretrained_model / layout.TRAIN_CONFIG,
    "training_state/": lambda s: s.training_state,
}


@pytest.fixture(scope="module")
def step(tmp_path_factory: pytest.TempPathFactory) -> StepDir:
    """An HSDP-shaped step (two steps in the root, `last` on the newer) with real model DCP shards."""
    base = tmp_path_factory.mktemp("resolve")
    step = make_step_dir(base)
    older = step.checkpoints / "004000"
    shutil.copytree(step.root, older, symlinks=True)  # `last` must win over "the newest dir"
    for root in (step.root, older):
        shutil.rmtree(root / layout.PRETRAINED_MODEL_DIR / layout.MODEL_DCP_DIR)
        save_model_dcp(root / layout.PRETRAINED_MODEL_DIR / layout.MODEL_DCP_DIR, weights(0))
    return step


def _same(a: str | os.PathLike[str], b: Path) -> bool:
    return Path(a).resolve() == b.resolve()


@pytest.mark.parametrize("form", FORMS)
def test_every_user_path_resolves_to_the_step_dir(step: StepDir, form: str) -> None:
    resolved = layout.resolve_step(FORMS[form](step))
    assert _same(resolved.root, step.root)
    assert not resolved.root.is_symlink()  # `last` is followed: a later save cannot move what was resolved
    assert resolved.step == 5000


@pytest.mark.parametrize("form", FORMS)
def test_every_tool_reads_the_step_the_path_means(step: StepDir, form: str) -> None:
    path = FORMS[form](step)
    dcp_dir = step.pretrained_model / layout.MODEL_DCP_DIR
    assert _same(convert_dcp(path, dry_run=True, progress=False).plan.dcp_dir, dcp_dir)
    assert _same(verify_resume(path).checkpoint, step.root)
    assert _same(plan_reshard(path, TargetRequest(nproc=4)).checkpoint, step.root)
    if form in ("train_config.json", "training_state/"):
        with pytest.raises(UsageError):  # a file, or the part a push never publishes (it holds no model)
            plan_publish(resolve_publish_folder(path))
    else:
        assert _same(resolve_publish_folder(path), step.pretrained_model)


@pytest.mark.parametrize("form", [f for f in FORMS if f not in ("train_config.json", "training_state/")])
def test_a_saved_policy_path_names_the_steps_pretrained_model(step: StepDir, form: str) -> None:
    pytest.importorskip("torch")
    from ckpt_tools.train.pretrained import resolve_policy_dir

    path = FORMS[form](step)
    assert _same(layout.pretrained_model_dir(path), step.pretrained_model)
    assert _same(resolve_policy_dir(str(path)), step.pretrained_model)  # --policy.path (the PEFT base too)


@pytest.mark.parametrize("form", FORMS)
def test_the_trainers_resume_reads_the_same_step(step: StepDir, form: str) -> None:
    pytest.importorskip("torch")
    from ckpt_tools.train.parsing import parse_train_config

    cfg, step_dir = parse_train_config(["--resume=true", f"--config_path={FORMS[form](step)}"])
    assert cfg.resume and step_dir == step.root.resolve()
    assert cfg.batch_size == 8  # the step's train_config.json is the base


def test_what_is_not_a_step_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such file or directory"):
        layout.resolve_step(tmp_path / "missing")
    root = make_step_dir(tmp_path / "a").checkpoints
    (root / layout.LAST_LINK).unlink()
    with pytest.raises(CheckpointError, match=r"checkpoints: no complete checkpoint \('last' is missing or dangling\)"):
        layout.resolve_step(root)
    os.symlink("999999", root / layout.LAST_LINK)
    with pytest.raises(CheckpointError, match="'last' is missing or dangling"):
        layout.resolve_step(root.parent)  # the run dir: through checkpoints/
    loose = tmp_path / "exported"  # a convert-dcp --output dir: config.json + weights, no step around it
    loose.mkdir()
    (loose / layout.POLICY_CONFIG).write_text("{}")
    with pytest.raises(CheckpointError, match="not inside a checkpoint step directory"):
        layout.resolve_step(loose)
    assert resolve_publish_folder(loose) == loose  # a push publishes a loose folder as it is
    assert layout.pretrained_model_dir(loose) == loose  # and --policy.path loads it as it is


def test_the_trainer_names_the_flag_when_the_path_is_no_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from ckpt_tools.train.parsing import parse_train_config

    with pytest.raises(CheckpointError, match=rf"^--config_path={tmp_path}: not a checkpoint"):
        parse_train_config(["--resume=true", f"--config_path={tmp_path}"])


def test_a_step_that_does_not_exist_names_the_steps_there(step: StepDir) -> None:
    """A mistyped step number lists what the run holds, for every tool (one resolver); a missing
    file inside an existing step stays a plain "no such file"."""
    typo = step.checkpoints / "000099"
    with pytest.raises(CheckpointError) as error:
        layout.resolve_step(typo / layout.PRETRAINED_MODEL_DIR)
    assert str(error.value) == (
        f"{typo / layout.PRETRAINED_MODEL_DIR}: no such step; {step.checkpoints} holds 2 step(s): 004000, 005000;"
        " last is 005000"
    )
    with pytest.raises(CheckpointError, match=r"no such step; .* holds 2 step"):
        verify_resume(typo)
    inside = step.root / layout.PRETRAINED_MODEL_DIR / "missing.safetensors"
    with pytest.raises(CheckpointError, match=r"missing\.safetensors: no such file or directory$"):
        layout.resolve_step(inside)
