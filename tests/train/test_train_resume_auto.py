"""``--resume=auto``: resume ``<output_dir>/checkpoints/last`` when there is one, else start a new run.

The decision is taken in process (``parse_train_args``, the entry point's start-up); the real
``torchrun --max-restarts=1`` jobs that survive faults this way are in
``tests/reliability/test_restart_faults.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckpt_tools.errors import ConfigError
from ckpt_tools.format.rules.resume_output import new_run_refusal
from ckpt_tools.train.env_guard import SHARED_STORE_OFF, check_restart_env
from devtools.training import TINY, step_dir
from tests.support.run_copy import copy_run
from tests.support.train_cli import refused_in_process

pytest.importorskip("torch")

AUTO = "--resume=auto"


def point_last(run: Path, step: int) -> None:
    last = run / "checkpoints" / "last"
    last.unlink()
    last.symlink_to(f"{step:06d}")


# ---------------------------------------------------------------------- no checkpoint yet: a new run


def test_auto_starts_a_new_run_where_no_checkpoint_was_saved_yet(tmp_path: Path) -> None:
    from ckpt_tools.train.parsing import parse_train_args

    out = tmp_path / "out"
    parsed = parse_train_args([*TINY, AUTO, f"--output_dir={out}"])  # the dir does not exist yet
    assert parsed.resume_from is None and not parsed.cfg.resume
    assert f"--resume=auto: no complete checkpoint in {out / 'checkpoints'}: starting a new run" in parsed.notes
    # What a launch killed before its first save leaves: logs and an unfinished save. A relaunch
    # starts again there (the new-run refusal does not fire) and appends to the logs.
    (out / "samples").mkdir(parents=True)
    (out / "samples" / "rank0.jsonl").write_text('{"step": 1, "indices": [0]}\n')
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    (out / "checkpoints" / ".000004.partial" / "pretrained_model").mkdir(parents=True)
    again = parse_train_args([*TINY, AUTO, f"--output_dir={out}"])
    assert again.resume_from is None and any("starting a new run" in note for note in again.notes)
    assert new_run_refusal(out) is None


def test_auto_needs_an_output_dir_and_takes_it_from_config_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ckpt_tools.train.parsing import parse_train_args

    assert refused_in_process([*TINY, AUTO], capsys) == (
        "error: --resume=auto needs --output_dir: the run it resumes, or starts when it has no checkpoint"
    )
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"output_dir": str(tmp_path / "from_file"), "steps": 3}))
    parsed = parse_train_args([*TINY, AUTO, f"--config_path={job}"])
    assert parsed.cfg.output_dir == str(tmp_path / "from_file") and parsed.cfg.steps == 3
    assert parsed.resume_from is None


# ---------------------------------------------------------------------- a checkpoint: resumed as --resume=true


def test_auto_resumes_last_exactly_as_resume_true(runs: dict[str, Path], tmp_path: Path) -> None:
    from ckpt_tools.train.config import train_config_dict
    from ckpt_tools.train.parsing import parse_train_args

    run = copy_run(runs["ddp"], tmp_path / "run")
    point_last(run, 4)  # the newest complete checkpoint a killed job left
    auto = parse_train_args([*TINY, AUTO, f"--output_dir={run}", "--steps=8"])
    explicit = parse_train_args(["--resume=true", f"--config_path={run / 'checkpoints' / 'last'}", "--steps=8"])
    assert auto.resume_from == explicit.resume_from == step_dir(run, 4).resolve()
    assert auto.cfg.resume and train_config_dict(auto.cfg) == train_config_dict(explicit.cfg)
    line = f"--resume=auto: resuming automatically from step 4 ({step_dir(run, 4).resolve()}, where"
    assert any(note.startswith(line) for note in auto.notes), auto.notes
    # --config_path is the job's config for a new run; with a checkpoint the checkpoint's config rules.
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"output_dir": str(run), "steps": 8, "seed": 5}))
    from_job = parse_train_args([AUTO, f"--config_path={job}"])
    assert from_job.resume_from == auto.resume_from and from_job.cfg.seed == auto.cfg.seed != 5
    assert any(f"not --config_path={job}" in note for note in from_job.notes)


def test_auto_applies_the_same_resume_checks(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint --resume=true refuses is refused by --resume=auto with the same line and code."""
    run = copy_run(runs["ddp"], tmp_path / "run")
    record = step_dir(run, 8) / "training_state" / "training_step.json"
    good = record.read_text()
    record.write_text(json.dumps({**json.loads(good), "step": 0}))  # parts from different steps
    explicit = refused_in_process(["--resume=true", f"--config_path={run / 'checkpoints' / 'last'}"], capsys, 3)
    assert refused_in_process([AUTO, f"--output_dir={run}"], capsys, 3) == explicit
    record.write_text(good)
    # A resume that would save over newer step dirs (two: one alone after `last` is a cut-off commit).
    shutil.copytree(step_dir(run, 8), step_dir(run, 12))
    point_last(run, 4)
    explicit = refused_in_process(["--resume=true", f"--config_path={run / 'checkpoints' / 'last'}"], capsys)
    assert refused_in_process([AUTO, f"--output_dir={run}"], capsys) == explicit
    assert "holds checkpoints after step 4 (000008, 000012)" in explicit


def test_auto_refuses_checkpoints_without_a_usable_last(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Step dirs but no ``last``: neither a new run over them nor a guess at which to continue."""
    run = copy_run(runs["ddp"], tmp_path / "run")
    (run / "checkpoints" / "last").unlink()
    line = refused_in_process([*TINY, AUTO, f"--output_dir={run}"], capsys)
    assert line.startswith(f"error: --resume=auto: {run / 'checkpoints'} has no usable last;")
    assert "already holds checkpoints; pass --resume=true" in line


def test_auto_of_a_finished_run_has_nothing_to_do(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A relaunch after the job finished exits 0 and writes nothing."""
    from tests.support.train_cli import exits_in_process

    run = copy_run(runs["ddp"], tmp_path / "run")
    out, _ = exits_in_process([AUTO, f"--output_dir={run}"], capsys, 0)
    assert out.startswith("nothing to do: the run is at step 8 and --steps=8")


# ---------------------------------------------------------------------- under torchrun --max-restarts


def test_restarts_on_torchruns_shared_store_are_refused() -> None:
    """What torchrun exports to a worker of ``--max-restarts=3`` on its shared store: refused, naming the fix."""
    shared = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3", "RANK": "0"}
    with pytest.raises(ConfigError, match=f"--max-restarts=3: .* export {SHARED_STORE_OFF}=1 before torchrun"):
        check_restart_env(shared)
    check_restart_env({**shared, "TORCHELASTIC_USE_AGENT_STORE": "False"})  # the fix: a store per launch
    check_restart_env({**shared, "TORCHELASTIC_MAX_RESTARTS": "0"})  # no relaunch, nothing to hang
