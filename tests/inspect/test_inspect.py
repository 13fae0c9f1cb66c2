"""``inspect``: what a checkpoint holds, its topology, per-rank shards and health, from headers only."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ckpt_tools.format.record import read_training_step
from ckpt_tools.inspect import inspect_path
from devtools.procs import run_cli
from devtools.training import LEGACY_CHECKPOINT
from tests.support.cli import invoke_cli
from tests.support.dcp_fixtures import (
    FSDP2_DCP,
    FSDP2_STEP,
    HSDP_STEP,
    PEFT_STEP,
    copy_tree,
    torch_reference,
)


def inspect_json(*args: str, code: int = 0, no_torch: bool = False) -> dict:
    """``inspect ARGS --json``: in-process, or as a real process without torch when ``no_torch``."""
    proc = run_cli("inspect", *args, "--json", no_torch=True) if no_torch else invoke_cli("inspect", *args, "--json")
    assert proc.returncode == code, (proc.stdout[-3000:], proc.stderr)
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


def failed(report: dict) -> list[str]:
    return [f"{c['name']}: {c['message']}" for c in report["checks"] if c["status"] == "fail"]


def test_checkpoints_root_lists_steps_last_and_partial_saves(ckpts: Path) -> None:
    report = inspect_json(str(ckpts / "fsdp2" / "checkpoints"), no_torch=True)
    assert report["kind"] == "checkpoints_root" and report["healthy"] is True
    assert [s["name"] for s in report["steps"]] == ["000005", "000010"]
    assert report["last"] == "000010" and report["inspected_step"] == "000010"
    assert report["partial_saves"] == [".000015.partial"]
    warn = [c for c in report["checks"] if c["status"] == "warn"]
    assert any(".000015.partial" in c["message"] for c in warn)


def test_step_report_topology_batch_params_and_rank_sizes(ckpts: Path, tmp_path: Path) -> None:
    step = ckpts / FSDP2_STEP
    report = inspect_json(str(step))
    record = read_training_step(step / "training_state" / "training_step.json")
    assert report["step"] == 10 and report["peft"] is False
    assert report["formats"] == ["dcp", "dcp optimizer"]
    assert report["processors"] == ["policy_preprocessor.json"]
    assert report["topology"] == record.topology.describe() and "FSDP" in report["topology"]
    assert report["batch"] == record.batch.describe()
    assert report["training_step"]["effective_batch_size"] == record.batch.effective_batch_size
    model = next(w for w in report["weights"] if w["path"].endswith("pytorch_model_fsdp_0"))
    ref = torch_reference(step / "pretrained_model" / "pytorch_model_fsdp_0", tmp_path)["model"]
    assert model["parameters"] == sum(t.numel() for t in ref.values())
    assert model["bytes"] == sum(t.numel() * t.element_size() for t in ref.values())
    assert model["bytes_by_dtype"]["bfloat16"] == ref["extras.bf16"].numel() * 2
    for rank in model["ranks"]:
        files = [step / "pretrained_model" / "pytorch_model_fsdp_0" / f for f in rank["files"]]
        assert rank["file_bytes"] == sum(f.stat().st_size for f in files)
    assert [r["rank"] for r in model["ranks"]] == [0, 1]


def test_hsdp_step_with_gathered_and_dcp_weights(ckpts: Path) -> None:
    report = inspect_json(str(ckpts / HSDP_STEP))
    assert "HSDP" in report["topology"] and "2×2" in report["topology"]
    assert report["formats"][:2] == ["safetensors", "dcp"]
    st = next(w for w in report["weights"] if w["format"] == "safetensors")
    dcp = next(w for w in report["weights"] if w["path"].endswith("pytorch_model_fsdp_0"))
    assert len(dcp["ranks"]) == 4
    model_params = st["parameters"]
    assert 0 < model_params < dcp["parameters"]  # the DCP also holds the extras


def test_tensors_lists_chunks(ckpts: Path) -> None:
    report = inspect_json(str(ckpts / FSDP2_DCP), "--tensors")
    big = next(t for t in report["tensors"] if t["name"] == "model.extras.big")
    assert big["dtype"] == "float32" and big["shape"] == [2600, 1030]
    assert [c["offsets"] for c in big["chunks"]] == [[0, 0], [1300, 0]]
    human = invoke_cli("inspect", str(ckpts / FSDP2_DCP), "--tensors")
    assert human.returncode == 0 and "model.extras.big" in human.stdout and "2 chunks" in human.stdout


def test_peft_step_is_recognised(ckpts: Path) -> None:
    report = inspect_json(str(ckpts / PEFT_STEP / "pretrained_model"))
    assert report["peft"] is True
    assert report["kind"] == "pretrained_model"


def test_missing_expected_file_fails_the_health_check(ckpts: Path, tmp_path: Path) -> None:
    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "000010")
    (step / "training_state" / "rng_state.safetensors").unlink()
    report = inspect_json(str(step), code=1)
    assert any("rng_state.safetensors" in f for f in failed(report))
    proc = invoke_cli("inspect", str(step))
    assert proc.returncode == 1 and "UNHEALTHY" in proc.stdout and "rng_state.safetensors" in proc.stdout


def test_fp16_run_needs_scaler_state(ckpts: Path, tmp_path: Path) -> None:
    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "000010")
    record_path = step / "training_state" / "training_step.json"
    record = json.loads(record_path.read_text())
    record["mixed_precision"] = "fp16"
    record_path.write_text(json.dumps(record))
    assert any("scaler_state.json" in f for f in failed(inspect_json(str(step), code=1)))


def test_truncated_shard_fails_the_health_check(ckpts: Path, tmp_path: Path) -> None:
    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "000010")
    shard = step / "pretrained_model" / "pytorch_model_fsdp_0" / "__1_0.distcp"
    os.truncate(shard, shard.stat().st_size - 100)
    assert any("truncated" in f for f in failed(inspect_json(str(step), code=1)))


def test_rank_count_must_match_the_topology(ckpts: Path, tmp_path: Path) -> None:
    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "000010")
    record_path = step / "training_state" / "training_step.json"
    record = json.loads(record_path.read_text())
    record["topology"] = {"world_size": 4, "dp_replicate": 1, "dp_shard": 4}
    record_path.write_text(json.dumps(record))
    assert any("world_size 4" in f for f in failed(inspect_json(str(step), code=1)))


def test_legacy_layout_is_named_plainly(tmp_path: Path) -> None:
    report = inspect_json(str(LEGACY_CHECKPOINT))
    assert report["legacy"] is True
    assert "0.6.x" in report["topology"] and "num_processes=2" in report["topology"]
    notes = [c["message"] for c in report["checks"] if c["name"] == "resumable layout"]
    assert notes and "cannot be resumed" in notes[0] and "pretrained policy" in notes[0]
    assert report["healthy"] is True  # its weights are fine; verify-resume is what refuses it


def test_single_safetensors_file_header_checks(tmp_path: Path) -> None:
    good = LEGACY_CHECKPOINT / "pretrained_model" / "model.safetensors"
    report = inspect_json(str(good))
    assert report["kind"] == "safetensors_file" and report["weights"][0]["tensors"] > 0
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(good.read_bytes()[:-10])
    report = inspect_json(str(bad), code=1)
    assert any("data section" in f for f in failed(report))


def test_not_a_checkpoint_exits_3(tmp_path: Path) -> None:
    for path in (tmp_path / "missing", tmp_path):  # a real process: the one-line contract end to end
        proc = run_cli("inspect", str(path))
        assert proc.returncode == 3, proc.stdout
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ")


def test_api_report_is_json_serialisable(ckpts: Path) -> None:
    report = inspect_path(ckpts / "fsdp2" / "checkpoints", tensors=True)
    assert json.loads(json.dumps(report.to_dict()))["healthy"] is True
    assert report.tensors and all(t.chunks for t in report.tensors)


def test_step_converted_with_delete_dcp_stays_healthy(ckpts: Path, tmp_path: Path) -> None:
    from ckpt_tools.convert import convert_dcp

    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "000010")
    convert_dcp(step, delete_dcp=True, progress=False)
    report = inspect_json(str(step))
    assert report["healthy"] is True and report["formats"][0] == "safetensors"
    assert any(c["name"] == "weights converted" and c["status"] == "warn" for c in report["checks"])
