"""A step's files are the ones its save wrote: the record every commit writes, and its refusals.

Each variant is a copy of a step the training core wrote with one file taken from another
save of the same run - the RNG state, the scheduler, a DCP shard - which the step counters
cannot tell apart (same names, types, shapes; the RNG state holds no counter at all). The rule
is checked where it is decided (``ckpt_tools.format.rules.save_files``) and through each of its
callers: ``inspect``, ``verify-resume``, ``reshard-plan`` and the trainer's resume.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from ckpt_tools.convert import convert_dcp
from ckpt_tools.errors import CheckpointError
from ckpt_tools.facts import save_files as files_against_record
from ckpt_tools.format import layout as L
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.rules import save_files
from ckpt_tools.inspect import inspect_path
from ckpt_tools.resume.plan import plan_reshard
from ckpt_tools.resume.verify import verify_resume
from ckpt_tools.train.checkpoint.load import preflight_resume, require_bulk_from_save
from ckpt_tools.train.parallel.distributed import DistEnv
from devtools.training import step_dir, train

TAKEN = {
    "rng": f"{L.TRAINING_STATE_DIR}/{L.RNG_STATE}",
    "scheduler": f"{L.TRAINING_STATE_DIR}/{L.SCHEDULER_STATE}",
    "optimizer shard": f"{L.TRAINING_STATE_DIR}/{L.OPTIMIZER_DCP_DIR}/__1_0.distcp",
    "model shard": f"{L.PRETRAINED_MODEL_DIR}/{L.MODEL_DCP_DIR}/__0_0.distcp",
}


ONE_PROCESS = DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, device=torch.device("cpu"), backend=None)


def copy_step(run: Path, step: int, tmp_path: Path) -> StepPaths:
    dst = tmp_path / "run" / L.CHECKPOINTS_DIR / f"{step:06d}"
    shutil.copytree(step_dir(run, step), dst)
    return StepPaths(dst)


def test_every_save_records_its_files(runs: dict[str, Path]) -> None:
    for name, run in runs.items():
        ids = set()
        for number in (4, 8):
            paths = StepPaths(step_dir(run, number))
            saved = save_files.read(paths)
            assert saved is not None, name
            on_disk = {p.relative_to(paths.root).as_posix() for p in paths.root.rglob("*") if p.is_file()} - {
                f"{L.TRAINING_STATE_DIR}/{L.SAVE_FILES}"
            }
            assert set(saved.files) == on_disk, name  # every file, each rank's shards included
            assert files_against_record.problems(paths, saved) == [], name
            assert not saved.files[f"{L.TRAINING_STATE_DIR}/{L.RNG_STATE}"].sampled  # small: its whole content
            ids.add(saved.save_id)
        assert len(ids) == 2, name  # one id per save


@pytest.mark.parametrize("what", list(TAKEN))
def test_a_file_from_another_save_is_refused_by_every_caller(runs: dict[str, Path], tmp_path: Path, what: str) -> None:
    run = runs["hsdp"] if "shard" in what else runs["ddp"]
    step = copy_step(run, 8, tmp_path)
    rel = TAKEN[what]
    shutil.copyfile(step_dir(run, 4) / rel, step.root / rel)  # the same file of the step-4 save

    line = files_against_record.mismatch(step)
    assert line is not None and rel in line, line
    if "shard" not in what:  # a file that carries its save's id says which save it came from
        assert "stamped by save" in line, line
    report = inspect_path(step.root)
    assert line in [c.message for c in report.checks if c.failed]
    verdict = verify_resume(step.root)
    assert not verdict.resumable and line in [c.message for c in verdict.failures]
    assert line in [c.message for c in plan_reshard(step.root).blockers]
    with pytest.raises(CheckpointError) as raised:  # the trainer: before any process group, or once it
        preflight_resume(step.root) if "shard" not in what else require_bulk_from_save(ONE_PROCESS, step)
    assert str(raised.value) == line


def test_a_dcp_file_the_save_did_not_write_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    step = copy_step(runs["hsdp"], 8, tmp_path)
    extra = step.optimizer_dcp / "__9_0.distcp"
    shutil.copyfile(step.optimizer_dcp / "__0_0.distcp", extra)
    line = files_against_record.mismatch(step)
    assert line is not None and "__9_0.distcp: a DCP file the save did not write" in line


def test_a_file_added_after_the_save_is_not_judged(runs: dict[str, Path], tmp_path: Path) -> None:
    """``convert-dcp`` writes model.safetensors next to the shards: not the save's, and not a mix-up."""
    step = copy_step(runs["hsdp"], 8, tmp_path)
    (step.pretrained_model / "notes.txt").write_text("converted on a laptop")
    assert files_against_record.mismatch(step) is None
    assert verify_resume(step.root).resumable


def test_a_malformed_record_is_one_line(runs: dict[str, Path], tmp_path: Path) -> None:
    step = copy_step(runs["ddp"], 8, tmp_path)
    doc = json.loads(step.save_files.read_text())
    doc["files"]["../../etc/passwd"] = {"size": 1, "blake2b": "00"}
    step.save_files.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="not a path inside the step"):
        save_files.read(step)
    assert not verify_resume(step.root).resumable


def test_a_checkpoint_without_a_record_says_so(runs: dict[str, Path], tmp_path: Path) -> None:
    step = copy_step(runs["ddp"], 8, tmp_path)
    step.save_files.unlink()
    assert files_against_record.mismatch(step) is None
    assert any("no record of the save's files" in note for note in inspect_path(step.root).notes)


def mixed_up_resume(run: Path, tmp_path: Path, what: str, nproc: int) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Step 8 of ``run`` with ``what`` from its step-4 save; (the tools' line, the real resume of it)."""
    step = copy_step(run, 8, tmp_path)
    shutil.copyfile(step_dir(run, 4) / TAKEN[what], step.root / TAKEN[what])
    line = files_against_record.mismatch(step)
    assert line is not None
    args = ("--resume=true", f"--config_path={step.train_config}", f"--output_dir={tmp_path / 'resumed'}", "--steps=10")
    return line, train(*args, nproc=nproc, timeout=240)


@pytest.mark.torchrun
def test_the_real_resume_refuses_with_the_same_line(runs: dict[str, Path], tmp_path: Path) -> None:
    line, proc = mixed_up_resume(runs["ddp"], tmp_path, "rng", nproc=1)
    assert proc.returncode == 3, (proc.stdout[-2000:], proc.stderr[-4000:])
    assert [x for x in proc.stderr.splitlines() if x.strip()] == [f"error: {line}"], proc.stderr


@pytest.mark.torchrun
def test_the_real_resume_shares_the_shard_reads_and_refuses_together(runs: dict[str, Path], tmp_path: Path) -> None:
    """A swapped shard is found by the one rank that samples it; every rank stops with its line."""
    line, proc = mixed_up_resume(runs["hsdp"], tmp_path, "optimizer shard", nproc=4)
    assert proc.returncode != 0
    assert f"error: {line}" in proc.stderr.splitlines(), proc.stderr[-3000:]


def test_a_convert_into_the_step_records_what_it_wrote(runs: dict[str, Path], tmp_path: Path) -> None:
    """convert-dcp --overwrite replaces the gathered weights the save wrote: the step stays the save's."""
    step = copy_step(runs["fsdp"], 8, tmp_path)  # safetensors_dcp: model.safetensors beside the shards
    before = save_files.read(step)
    convert_dcp(step.root, dtype="bf16", overwrite=True)  # a different file than the save wrote
    assert files_against_record.mismatch(step) is None
    after = save_files.read(step)
    assert after is not None and before is not None and after.save_id == before.save_id
    rel = f"{L.PRETRAINED_MODEL_DIR}/{L.MODEL_WEIGHTS}"
    assert after.files[rel] != before.files[rel]


def test_a_convert_beside_an_unreadable_record_keeps_its_output(runs: dict[str, Path], tmp_path: Path) -> None:
    step = copy_step(runs["fsdp"], 8, tmp_path)
    step.save_files.write_text("{not json")
    result = convert_dcp(step.root, output=tmp_path / "out.safetensors")
    assert all(p.is_file() for p in result.output_files)
    assert not verify_resume(step.root).resumable  # the record's damage is reported where it is checked


def test_a_convert_elsewhere_leaves_the_step_untouched(runs: dict[str, Path], tmp_path: Path) -> None:
    step = copy_step(runs["fsdp"], 8, tmp_path)
    text = step.save_files.read_bytes()[:-1]  # the record, cut by one byte: still JSON (the fuzz's case)
    step.save_files.write_bytes(text)
    before = step.save_files.stat().st_mtime_ns
    convert_dcp(step.root, output=tmp_path / "elsewhere" / "model.safetensors")
    assert step.save_files.read_bytes() == text and step.save_files.stat().st_mtime_ns == before
