"""``inspect`` on what other producers wrote (fixtures/producers/): safetensors folders, torch's HF-storage
pieces (always shown as pieces of their tensors), every dtype, zstd and rank-local DCP."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from ckpt_tools.convert import convert_dcp
from ckpt_tools.errors import CheckpointError
from ckpt_tools.inspect import InspectReport, inspect_path
from devtools.procs import run_cli
from tests.support.producers import (
    DTYPES_DCP,
    HF_CONSOLIDATED,
    HF_DISTRIBUTED,
    HF_FULL,
    RANK_LOCAL_DCP,
    ZSTD_DCP,
)


def failed(report: InspectReport) -> list[str]:
    return [f"{c.name}: {c.message}" for c in report.checks if c.failed]


def test_a_max_shard_size_output_folder_is_a_checkpoint(tmp_path: Path) -> None:
    """The project's own ``convert-dcp --max-shard-size`` output, outside any step dir."""
    out = tmp_path / "sharded"
    result = convert_dcp(ZSTD_DCP, output=out, max_shard_size="200B", progress=False)
    assert len(result.output_files) > 2  # several shards and the index
    for path in (out, out / "model.safetensors.index.json"):
        report = inspect_path(path, tensors=True)
        assert report.kind == "safetensors_dir" and report.healthy, failed(report)
        assert [w.path for w in report.weights] == ["model.safetensors.index.json"]
        assert sorted(t.name for t in report.tensors) == sorted(
            ["embed.weight", "proj.weight", "head.weight", "head.bias", "steps"]
        )


def test_torchs_rank0_hf_save_and_its_consolidation_are_whole_tensors() -> None:
    for folder in (HF_FULL, HF_CONSOLIDATED):
        report = inspect_path(folder, tensors=True)
        assert report.healthy, failed(report)
        assert report.tensors and all(not t.chunks for t in report.tensors)
    assert any("sharded/ holds torch's HF-storage pieces" in n for n in inspect_path(HF_CONSOLIDATED).notes)


def test_distributed_hf_pieces_are_tensors_in_pieces() -> None:
    report = inspect_path(HF_DISTRIBUTED, tensors=True)
    assert report.healthy, failed(report)
    assert report.weights[0].format.startswith("safetensors pieces") and report.weights[0].tensors == 5
    embed = next(t for t in report.tensors if t.name == "embed.weight")
    assert embed.shape == (9, 5)
    assert sorted((c["offsets"], c["sizes"]) for c in embed.chunks) == [
        ([0, 0], [3, 5]),
        ([3, 0], [3, 5]),
        ([6, 0], [3, 5]),
    ]
    assert any(c.name == "pieces" and c.status == "pass" for c in report.checks)


def test_one_piece_is_never_reported_as_a_whole_tensor() -> None:
    piece = next(HF_DISTRIBUTED.glob("shard-00002-*.safetensors"))
    report = inspect_path(piece, tensors=True)
    embed = next(t for t in report.tensors if t.name == "embed.weight")
    assert embed.shape == (9, 5) and [(c["offsets"], c["sizes"]) for c in embed.chunks] == [([3, 0], [3, 5])]
    warned = [c for c in report.checks if c.status == "warn" and c.name.endswith("pieces")]
    assert warned and "embed.weight [3, 5] at offset [3, 0] of [9, 5]" in warned[0].message
    proc = run_cli("inspect", str(piece), "--tensors", no_torch=True)
    assert proc.returncode == 0, proc.stderr
    assert "piece [3, 5] at [3, 0]" in proc.stdout


def test_a_missing_piece_is_a_hole(tmp_path: Path) -> None:
    """Without rank 2's file the [9, 5] tensor has rows 3..5 missing: inspect fails it, convert-dcp refuses."""
    folder = tmp_path / "pieces"
    folder.mkdir()
    for f in HF_DISTRIBUTED.iterdir():
        if "shard-00002" not in f.name:
            shutil.copy(f, folder / f.name)
    report = inspect_path(folder)
    assert any("embed.weight" in f and "cover 30 of 45 elements" in f for f in failed(report)), failed(report)
    proc = run_cli("convert-dcp", str(folder), "--output", str(tmp_path / "out"), no_torch=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and "cover" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_every_dtype_is_healthy_and_the_unrepresentable_ones_are_named() -> None:
    report = inspect_path(DTYPES_DCP, tensors=True)
    assert report.healthy, failed(report)
    assert any("complex128" in n and "complex32" in n and "convert-dcp skips them" in n for n in report.notes)
    assert {"float8_e8m0fnu", "float8_e4m3fnuz", "float8_e5m2fnuz", "complex64"} <= {t.dtype for t in report.tensors}


def test_every_dtype_inspect_json_without_torch() -> None:
    proc = run_cli("inspect", str(DTYPES_DCP), "--json", no_torch=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["healthy"] is True


def test_zstd_dcp_is_read_and_without_zstandard_one_line_says_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    report = inspect_path(ZSTD_DCP)
    assert report.healthy, failed(report)
    assert any("chunk data" in c.name and c.status == "pass" for c in report.checks)
    assert any("zstd-compressed" in n for n in report.notes)
    monkeypatch.setitem(sys.modules, "zstandard", None)
    report = inspect_path(ZSTD_DCP)
    warned = [c for c in report.checks if c.status == "warn"]
    assert len(warned) == 1 and "install zstandard" in warned[0].message, report.checks
    with pytest.raises(CheckpointError, match="install zstandard"):
        convert_dcp(ZSTD_DCP, dry_run=True, progress=False)


def test_rank_local_metadata_is_read_as_their_union() -> None:
    report = inspect_path(RANK_LOCAL_DCP, tensors=True)
    assert report.healthy, failed(report)
    meta = next(c for c in report.checks if c.name.endswith(".metadata"))
    assert "union of __0.metadata, __1.metadata" in meta.message
    sharded = next(t for t in report.tensors if t.name == "model.sharded.weight")
    assert [c["sizes"] for c in sharded.chunks] == [[3, 4], [3, 4]]
