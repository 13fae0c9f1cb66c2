"""``inspect``: what a checkpoint holds, its topology, per-rank shards and health, from headers only
(and, with ``--check-values``, whether any tensor holds NaN or infinite values)."""

from __future__ import annotations

import json
import math
import os
import struct
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
from tests.support.save_record import without_save_record


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
    record["parallelism"] = {
        **record.get("parallelism", {}),
        "dp_replicate": 1,
        "dp_shard": 4,
    }  # a record at one with itself
    record["dp_world_size"] = 4
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


# ====================================================================== --check-values


def poke_safetensors(path: Path, tensor: str, values: dict[int, float]) -> None:
    """Overwrite elements of a float32 tensor in place (offsets from the file's own header)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    begin = json.loads(data[8 : 8 + n])[tensor]["data_offsets"][0]
    with path.open("r+b") as f:
        for index, value in values.items():
            f.seek(8 + n + begin + 4 * index)
            f.write(struct.pack("<f", value))


def poke_dcp(directory: Path, fqn: str, values: dict[int, float]) -> None:
    """Overwrite elements of the first chunk of a float32 tensor in its ``.distcp`` file."""
    from ckpt_tools.dcp.files import ShardFiles
    from ckpt_tools.dcp.index import ChunkIndex
    from ckpt_tools.dcp.validate import tensor_layouts

    index = ChunkIndex.load(directory)
    entry = index.tensors[fqn]
    with ShardFiles(index.root) as files:
        layout = tensor_layouts(entry, files)[0]
    with (directory / entry.chunks[0].file).open("r+b") as f:
        for i, value in values.items():
            f.seek(layout.data_offset + 4 * i)
            f.write(struct.pack("<f", value))


def test_check_values_counts_nan_and_inf_per_tensor(runs: dict[str, Path], tmp_path: Path) -> None:
    """A real FSDP step (model.safetensors + model and optimizer DCP) with NaN and inf written into it."""
    import torch

    from devtools.training import dcp_to_dict

    step = without_save_record(copy_tree(runs["fsdp"] / "checkpoints" / "000004", tmp_path / "000004"))
    clean = inspect_path(step, check_values=True)
    assert clean.healthy and clean.nonfinite == []
    assert [c.name for c in clean.checks if c.name.endswith(" values")][:3] == [
        "pretrained_model/model.safetensors values",
        "pretrained_model/pytorch_model_fsdp_0 values",
        "training_state/optimizer_0 values",
    ]
    weights = step / "pretrained_model" / "model.safetensors"
    poke_safetensors(weights, "encoder.layers.0.linear1.weight", {0: math.nan, 7: math.nan, 9: math.inf})
    optimizer = step / "training_state" / "optimizer_0"
    slot = "optimizer.state.encoder.layers.0.linear1.weight.exp_avg_sq"
    poke_dcp(optimizer, slot, {1: -math.inf})
    # What torch reads back holds exactly what was written.
    from safetensors.torch import load_file

    poked = load_file(str(weights))["encoder.layers.0.linear1.weight"]
    assert int(poked.isnan().sum()) == 2 and int(poked.isinf().sum()) == 1
    torch_slot = dcp_to_dict(optimizer, tmp_path)["optimizer"]["state"]["encoder.layers.0.linear1.weight"]["exp_avg_sq"]
    assert int(torch.isinf(torch_slot).sum()) == 1 and not torch_slot.isnan().any()

    assert inspect_path(step).healthy  # headers only: no tensor data is read without the option
    report = inspect_json(str(step), "--check-values", code=1, no_torch=True)  # a real process, torch-free
    assert report["values_checked"] is True and report["healthy"] is False
    assert report["nonfinite"] == [
        {
            "file": "pretrained_model/model.safetensors",
            "tensor": "encoder.layers.0.linear1.weight",
            "nan": 2,
            "inf": 1,
        },
        {"file": "training_state/optimizer_0", "tensor": slot, "nan": 0, "inf": 1},
    ]
    assert failed(report) == [
        "pretrained_model/model.safetensors values: 1 of 48 floating-point tensors hold NaN or infinite values:"
        " encoder.layers.0.linear1.weight (2 NaN, 1 inf)",
        f"training_state/optimizer_0 values: 1 of 144 floating-point tensors hold NaN or infinite values: {slot} (1 inf)",
    ]
    text = invoke_cli("inspect", str(step), "--check-values")
    assert text.returncode == 1 and "UNHEALTHY" in text.stdout
    assert "pretrained_model/model.safetensors: encoder.layers.0.linear1.weight: 2 NaN, 1 inf" in text.stdout
