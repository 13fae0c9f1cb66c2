"""training_step.json: round trip, older and foreign records, batch factorization."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_tools.errors import CheckpointError
from ckpt_tools.format.record import (
    SCHEMA_VERSION,
    BatchFactorization,
    Layout,
    RecordSchema,
    SamplerPosition,
    Topology,
    TrainingStep,
    layout_for,
    read_training_step,
    training_step_json,
)
from tests.support.lerobot_fixtures import LEROBOT_FIXTURES


def full_record() -> TrainingStep:
    return TrainingStep(
        step=40,
        samples_seen=640,
        optimizer_steps=20,
        dp_world_size=4,
        batch_size=8,
        grad_accum_steps=2,
        mixed_precision="bf16",
        checkpoint_format="dcp",
        topology=Topology(world_size=4, dp_replicate=2, dp_shard=2, nnodes=1),
        sampler=SamplerPosition(epoch=0, offset=640, seed=1000, dataset_size=2000),
        sharded=True,
        peft=False,
        versions={"torch": "2.13.0", "ckpt_tools": "0.1.0"},
    )


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "training_step.json"
    path.write_text(training_step_json(full_record()))
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["topology"]["layout"] == "hsdp"
    assert data["effective_batch_size"] == 64
    back = read_training_step(path)
    assert back.unknown == ()
    assert back.topology == full_record().topology
    assert back.sampler == full_record().sampler
    assert back.batch == BatchFactorization(8, 4, 2)
    assert not back.is_legacy


def test_our_record_is_a_superset_of_lerobot_mains(lerobot_main_record: dict[str, object]) -> None:
    data = full_record().to_dict()
    # Every key LeRobot main's record has, with the same JSON types (load_training_metadata reads them).
    assert set(lerobot_main_record) <= set(data)
    for key, value in lerobot_main_record.items():
        assert type(data[key]) is type(value), key
    assert data["parallelism"] == {"dp_replicate": 2, "dp_shard": 2, "ring_degree": 1, "ulysses_degree": 1}
    assert set(data["parallelism"]) == set(lerobot_main_record["parallelism"])  # type: ignore[arg-type]
    assert RecordSchema.of(data) is RecordSchema.CKPT_TRAIN  # still ours, by schema_version
    assert TrainingStep.from_dict(data).topology == full_record().topology
    data["parallelism"] = {**data["parallelism"], "dp_shard": 4}
    with pytest.raises(CheckpointError, match="'parallelism' 2×4 disagrees with 'topology' 2×2"):
        TrainingStep.from_dict(data)


@pytest.fixture
def lerobot_main_record() -> dict[str, object]:
    """training_step.json as LeRobot main wrote it (fixtures/lerobot/main)."""
    path = LEROBOT_FIXTURES / "main/single/checkpoints/000004/training_state/training_step.json"
    data: dict[str, object] = json.loads(path.read_text())
    return data


def test_legacy_record_says_what_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "training_step.json"
    path.write_text(json.dumps({"step": 5000, "num_processes": 4}))
    record = read_training_step(path)
    assert record.is_legacy
    assert record.legacy_num_processes == 4
    assert "topology" in record.unknown and "sampler" in record.unknown
    summary = record.unknown_summary()
    assert summary is not None and "0.6.x" in summary and "topology" in summary


def test_foreign_record_keeps_extra_keys() -> None:
    record = TrainingStep.from_dict({"step": 3, "batch_size": 2, "wandb_run": "x"})
    assert record.extra == {"wandb_run": "x"}
    assert record.batch_size == 2
    assert "dp_world_size" in record.unknown
    assert record.batch is None


@pytest.mark.parametrize(
    "payload, needle",
    [
        ({"num_processes": 2}, "no 'step'"),
        ({"step": "ten"}, "'step' must be a non-negative integer"),
        ({"step": 1, "sharded": "yes"}, "'sharded' must be true or false"),
        ({"step": 1, "topology": {"world_size": 4, "dp_replicate": 3, "dp_shard": 2}}, "≠ world_size 4"),
        ({"step": 1, "topology": [1, 2]}, "'topology' must be an object"),
        ([1, 2, 3], "expected a JSON object"),
        ({"step": 1, "batch_size": 0}, "'batch_size' must be a positive integer, got 0"),
        ({"step": 1, "grad_accum_steps": 0}, "'grad_accum_steps' must be a positive integer"),
        ({"step": 1, "dp_world_size": 0}, "'dp_world_size' must be a positive integer"),
        ({"step": 1, "num_processes": 0}, "'num_processes' must be a positive integer"),
    ],
)
def test_bad_records_give_one_clear_line(payload: object, needle: str) -> None:
    with pytest.raises(CheckpointError) as info:
        TrainingStep.from_dict(payload)  # type: ignore[arg-type]
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_read_missing_and_invalid(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="missing"):
        read_training_step(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_training_step(bad)


def test_layouts() -> None:
    assert layout_for(1, 1, 1) is Layout.SINGLE
    assert layout_for(2, 2, 1) is Layout.DDP
    assert layout_for(2, 1, 2) is Layout.FSDP
    assert layout_for(4, 2, 2) is Layout.HSDP
    assert Layout.HSDP.sharded and not Layout.DDP.sharded
    with pytest.raises(ValueError):
        layout_for(4, 3, 1)
    assert Topology(4, 2, 2).describe().startswith("HSDP over 2×2")


def test_a_zero_batch_factor_is_one_line_in_verify_resume_and_reshard_plan(tmp_path: Path) -> None:
    """Both divided by it (ZeroDivisionError) before the record refused it."""
    import shutil

    from ckpt_tools.resume.plan import plan_reshard
    from ckpt_tools.resume.verify import verify_resume
    from tests.support.lerobot_fixtures import main_run

    run = tmp_path / "run"
    shutil.copytree(main_run("fsdp-dcp"), run, symlinks=True)
    record = run / "checkpoints" / "000004" / "training_state" / "training_step.json"
    record.write_text(record.read_text().replace('"batch_size": 2', '"batch_size": 0'))
    assert not verify_resume(run / "checkpoints" / "000004").resumable
    with pytest.raises(CheckpointError, match="'batch_size' must be a positive integer"):
        plan_reshard(run / "checkpoints" / "000004")
