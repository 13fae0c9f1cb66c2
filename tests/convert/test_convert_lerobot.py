"""``convert-dcp`` / ``lerobot-convert-dcp`` on LeRobot's own DCP checkpoints: byte for byte LeRobot's converter.

Each DCP run in ``fixtures/lerobot/main`` holds ``reference/<step>/model.safetensors``, written by
LeRobot's ``lerobot-convert-dcp`` (accelerate's ``merge_fsdp_weights``) from the same shards.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ckpt_tools.cli.lerobot_convert_dcp import convert_dcp_main
from tests.support.cli import invoke_cli
from tests.support.lerobot_fixtures import main_run

DCP_RUNS = ("fsdp-dcp", "fsdp-safetensors_dcp", "hsdp-dcp")


@pytest.mark.parametrize("name", DCP_RUNS)
def test_convert_dcp_writes_lerobots_bytes(name: str, tmp_path: Path) -> None:
    step = main_run(name) / "checkpoints" / "000004"
    out = tmp_path / "out"
    proc = invoke_cli("convert-dcp", str(step), "--output", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    reference = main_run(name) / "reference" / "000004" / "model.safetensors"
    assert (out / "model.safetensors").read_bytes() == reference.read_bytes()


@pytest.mark.parametrize("name", DCP_RUNS)
def test_lerobot_convert_dcp_in_place_matches_lerobots_output(name: str, tmp_path: Path) -> None:
    run = shutil.copytree(main_run(name), tmp_path / name, symlinks=True)
    convert_dcp_main([f"--checkpoint_dir={run}/checkpoints/000004", "--quiet=true"])
    written = run / "checkpoints" / "000004" / "pretrained_model" / "model.safetensors"
    assert written.read_bytes() == (run / "reference" / "000004" / "model.safetensors").read_bytes()


def test_delete_dcp_keeps_the_shards_lerobots_resume_reads(tmp_path: Path) -> None:
    run = shutil.copytree(main_run("fsdp-dcp"), tmp_path / "run", symlinks=True)
    step = run / "checkpoints" / "000004"
    proc = invoke_cli("convert-dcp", str(step), "--delete-dcp", "--quiet")
    assert proc.returncode == 2 and "nothing deleted" in proc.stderr
    assert "LeRobot resumes this checkpoint_format=dcp run's weights from pretrained_model/pytorch_model_fsdp_0/" in (
        proc.stderr
    )
    assert (step / "pretrained_model" / "pytorch_model_fsdp_0" / ".metadata").is_file()
