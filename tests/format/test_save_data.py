"""Every byte a save writes is digested as it is written, stamped with its save id, and verifiable.

The full digests (``save_files.json`` schema 2) are what ``inspect --verify-data`` reads every
byte against; the cheap check every resume and tool runs (sizes, both 4 KiB ends of bulk files)
does not see a bit flipped in the middle of a shard, and these tests show both sides of that on
real trainer checkpoints (the session's ``runs``). The stamp tests of the cheap check's line are
in ``test_save_files.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckpt_tools.errors import CheckpointError
from ckpt_tools.facts import save_data, save_stamps
from ckpt_tools.facts import save_files as files_against_record
from ckpt_tools.format import layout as L
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.rules import save_files
from ckpt_tools.inspect import inspect_path
from devtools.training import LEGACY_CHECKPOINT, step_dir
from tests.support.cli import invoke_cli

SHARD = f"{L.PRETRAINED_MODEL_DIR}/{L.MODEL_DCP_DIR}/__0_0.distcp"
GATHERED = f"{L.PRETRAINED_MODEL_DIR}/{L.MODEL_WEIGHTS}"


def copy_step(run: Path, step: int, tmp_path: Path) -> StepPaths:
    dst = tmp_path / "run" / L.CHECKPOINTS_DIR / f"{step:06d}"
    shutil.copytree(step_dir(run, step), dst)
    return StepPaths(dst)


def flip_middle_bit(path: Path) -> int:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0x10
    path.write_bytes(bytes(data))
    return middle


def test_every_file_is_digested_whole_and_stamped(runs: dict[str, Path]) -> None:
    for name, run in runs.items():
        paths = StepPaths(step_dir(run, 8))
        saved = save_files.read(paths)
        assert saved is not None and json.loads(paths.save_files.read_text())["schema"] == save_files.SCHEMA
        assert all(f.verifiable for f in saved.files.values()), name
        verdict = save_data.verify(paths, saved)
        assert verdict.problems == [] and verdict.unverifiable == [] and verdict.bytes > 0, name
        stamped = {
            rel: save_stamps.stamped_id(paths.root / rel)
            for rel in saved.files
            if rel.endswith(("training_step.json", "rng_state.safetensors", L.MODEL_WEIGHTS))
        }
        assert set(stamped.values()) == {saved.save_id}, (name, stamped)
        for directory in (paths.model_dcp, paths.optimizer_dcp):
            if directory.is_dir():
                assert save_stamps.dcp_stamped_id(directory) == saved.save_id, name
    fsdp = save_files.read(StepPaths(step_dir(runs["fsdp"], 8)))
    assert fsdp is not None and len(fsdp.files[GATHERED].pieces) > 2  # each rank's rows, digested where written


def test_a_flipped_bit_mid_shard_is_found_by_verify_data_only(runs: dict[str, Path], tmp_path: Path) -> None:
    step = copy_step(runs["fsdp"], 8, tmp_path)  # safetensors_dcp: DCP shards and the gathered file
    flip_middle_bit(step.root / SHARD)
    assert files_against_record.mismatch(step) is None  # the 4 KiB ends are intact
    assert inspect_path(step.root).healthy
    proc = invoke_cli("inspect", str(step.root), "--verify-data")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{SHARD}: its bytes differ from what the save wrote" in proc.stdout, proc.stdout

    offset = flip_middle_bit(step.root / GATHERED)  # pieces say where: the range holding that byte
    report = inspect_path(step.root, verify_data=True)
    (line,) = [c.message for c in report.checks if c.name == "data digests"]
    pieces = save_files.read(step).files[GATHERED].pieces  # type: ignore[union-attr]
    start, length, _ = next(p for p in pieces if p[0] <= offset < p[0] + p[1])
    assert f"{GATHERED}: bytes {start}-{start + length - 1} differ" in line and SHARD in line, line


def test_verify_data_reports_its_speed(runs: dict[str, Path]) -> None:
    report = inspect_path(step_dir(runs["hsdp"], 8), verify_data=True)
    (check,) = [c for c in report.checks if c.name == "data digests"]
    assert check.status == "pass" and "GB/s" in check.message and report.data_verified, check
    assert report.data_bytes > 0 and report.data_gb_per_s is not None


def test_a_schema_1_record_is_still_read(runs: dict[str, Path], tmp_path: Path) -> None:
    step = copy_step(runs["ddp"], 8, tmp_path)
    doc = json.loads(step.save_files.read_text())
    doc["schema"] = 1
    for entry in doc["files"].values():
        entry.pop(save_files.FULL, None)
        entry.pop(save_files.PIECES, None)
    step.save_files.write_text(json.dumps(doc))
    saved = save_files.read(step)
    assert saved is not None and not any(f.verifiable for f in saved.files.values())
    assert files_against_record.mismatch(step) is None
    report = inspect_path(step.root, verify_data=True)
    (check,) = [c for c in report.checks if c.name == "data digests"]
    assert check.status == "warn" and "no per-byte verification is possible" in check.message
    assert report.healthy and not report.data_verified


def test_a_checkpoint_without_a_record_cannot_be_verified_and_says_so(tmp_path: Path) -> None:
    step = tmp_path / "000100"
    shutil.copytree(LEGACY_CHECKPOINT, step)  # LeRobot 0.6.x: no record of its save's files
    proc = invoke_cli("inspect", str(step), "--verify-data")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"data digests: {save_data.NO_RECORD}" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    ("pieces", "error"),
    [([[0, 10, "a"], [12, 5, "b"]], "does not continue at byte 10"), ([[0, 10, "a"]], "cover 10 bytes of 20")],
)
def test_pieces_must_tile_the_file(
    runs: dict[str, Path], tmp_path: Path, pieces: list[list[object]], error: str
) -> None:
    step = copy_step(runs["fsdp"], 8, tmp_path)
    doc = json.loads(step.save_files.read_text())
    entry = doc["files"][GATHERED]
    entry["size"] = 20
    entry[save_files.PIECES] = pieces
    step.save_files.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=error):
        save_files.read(step)
