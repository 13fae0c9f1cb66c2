"""LeRobot's records and files, read as LeRobot's source writes them (records built here, in memory or tmp_path).

The checkpoints LeRobot itself wrote are in ``fixtures/lerobot/`` (tests/inspect, tests/resume,
tests/train use them); these tests pin each reading rule on the smallest input that shows it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from ckpt_tools.errors import CheckpointError
from ckpt_tools.facts.record import read_record
from ckpt_tools.format import layout, lerobot, manifest
from ckpt_tools.format.param_groups import read_param_groups
from ckpt_tools.format.record import Layout, RecordSchema, TrainingStep
from ckpt_tools.format.rules.sampler_position import sampler_state, samples_seen


def main_record(dp_replicate: int = 1, dp_shard: int = 2, **extra: object) -> dict[str, object]:
    """As LeRobot main's ``src/lerobot/common/train_utils.py`` ``save_training_metadata`` writes it."""
    return {
        "step": 4,
        "dp_world_size": dp_replicate * dp_shard,
        "batch_size": 2,
        "grad_accum_steps": 1,
        "parallelism": {"dp_replicate": dp_replicate, "dp_shard": dp_shard, "ring_degree": 1, "ulysses_degree": 1},
        **extra,
    }


def test_lerobot_main_record_gives_topology_batch_and_data_position() -> None:
    record = TrainingStep.from_dict(main_record())
    assert record.schema is RecordSchema.LEROBOT and not record.is_legacy
    assert record.topology is not None and record.topology.layout is Layout.FSDP
    assert (record.topology.world_size, record.topology.dp_replicate, record.topology.dp_shard) == (2, 1, 2)
    assert record.sharded is True
    assert record.batch is not None and record.batch.effective_batch_size == 4
    assert record.samples_seen == 4 * 2 * 2 and record.derived == ("samples_seen",)
    assert record.unknown == ()  # it says everything LeRobot records
    hsdp = TrainingStep.from_dict(main_record(dp_replicate=2, dp_shard=2))
    assert hsdp.topology is not None and hsdp.topology.layout is Layout.HSDP and hsdp.samples_seen == 32
    ddp = TrainingStep.from_dict(main_record(dp_replicate=2, dp_shard=1))
    assert ddp.topology is not None and ddp.topology.layout is Layout.DDP and ddp.sharded is False


@pytest.mark.parametrize(
    "payload, needle",
    [
        (main_record(parallelism={"dp_replicate": 1, "dp_shard": 2, "ring_degree": 2}), "context parallelism"),
        ({**main_record(), "dp_world_size": 3}, "dp_world_size 3, but the parallelism 1×2 makes 2"),
        (main_record(parallelism={"dp_replicate": 0, "dp_shard": 2}), "'parallelism.dp_replicate' must be"),
    ],
)
def test_bad_lerobot_records_give_one_line(payload: dict[str, object], needle: str) -> None:
    with pytest.raises(CheckpointError) as info:
        TrainingStep.from_dict(payload)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_lerobot_0_6_record_reads_num_processes_as_the_world() -> None:
    # LeRobot 0.6.1 lerobot/common/train_utils.py save_training_step: {step, num_processes, batch_size}.
    record = TrainingStep.from_dict({"step": 4, "num_processes": 2, "batch_size": 2})
    assert record.schema is RecordSchema.LEGACY and record.is_legacy
    assert record.dp_world_size == 2 and record.grad_accum_steps == 1  # 0.6.x had no gradient accumulation
    assert record.samples_seen == 16 and set(record.derived) == {"grad_accum_steps", "samples_seen"}
    assert record.topology is None  # whether it was sharded only the files say


def test_sampler_position_is_lerobots_rule() -> None:
    # main src/lerobot/common/train_utils.py save_training_metadata: offset = step x batch_size x dp_world_size.
    assert samples_seen(step=7, batch_size=8, dp_world_size=4) == 224
    # datasets/sampler.py compute_sampler_state: batches_per_epoch = ceil(ceil(120 / 8) / 4) = 4.
    state = sampler_state(7, 120, 8, 4)
    assert state is not None and (state.epoch, state.start_index) == (1, 96)
    # The epoch's last step is padded (even_batches): the start index never passes the frames.
    padded = sampler_state(3, 100, 8, 4)
    assert padded is not None and (padded.epoch, padded.start_index) == (0, 96)
    assert sampler_state(4, 0, 8, 4) is None


def test_lerobot_optimizer_keys_split_at_their_slashes() -> None:
    # optim/optimizers.py _save_single_optimizer_state: flatten_dict(optimizer.state_dict()), sep="/".
    assert layout.split_flat_optimizer_key("state/12/exp_avg_sq") == ("12", "exp_avg_sq")
    assert layout.split_flat_optimizer_key("state/model.encoder.layers.0.linear1.weight/step") == (
        "model.encoder.layers.0.linear1.weight",
        "step",
    )
    assert layout.split_flat_optimizer_key("state.encoder.weight.exp_avg") == ("encoder.weight", "exp_avg")
    assert lerobot.keyed_by_name(["state/0/exp_avg", "state/1/step"]) is False
    assert lerobot.keyed_by_name(["state/model.a.weight/exp_avg"]) is True
    assert lerobot.keyed_by_name(["state.0.exp_avg"]) is None  # not LeRobot's format


def test_lerobot_param_groups_are_a_bare_list(tmp_path: Path) -> None:
    # write_json(param_groups, ...) in _save_single_optimizer_state: the list itself.
    path = tmp_path / "optimizer_param_groups.json"
    path.write_text(json.dumps([{"lr": 1e-5, "params": [0, 1, 2]}, {"lr": 1e-5, "params": [3]}], indent=4))
    groups = read_param_groups(path, lerobot_form=True)
    assert groups.names == ["0", "1", "2", "3"] and groups.scalars == {}
    with pytest.raises(CheckpointError, match=r"parameters by position, but optimizer_state\.safetensors names none"):
        read_param_groups(path)  # ckpt-train's own loader needs the names LeRobot does not write
    by_name = read_param_groups(path, names=["a", "b.c", "d", "e"])  # as ckpt-train writes it
    assert [g["params"] for g in by_name.groups] == [["a", "b.c", "d"], ["e"]]
    with pytest.raises(CheckpointError, match="the optimizer state names 3 parameters"):
        read_param_groups(path, names=["a", "b", "c"])
    path.write_text(json.dumps([{"params": [True]}]))
    with pytest.raises(CheckpointError, match="not a param-groups file"):
        read_param_groups(path, lerobot_form=True)


def lerobot_0_6_step(root: Path, *, by_name: bool, num_processes: int = 2) -> layout.StepPaths:
    """A 0.6.1 training_state/ as save_training_state writes it: record, flat optimizer, param groups."""
    paths = layout.StepPaths(root / "000004")
    paths.training_state.mkdir(parents=True)
    paths.training_step.write_text(json.dumps({"step": 4, "num_processes": num_processes, "batch_size": 2}))
    owners = ["model.action_head.weight", "model.action_head.bias"] if by_name else ["0", "1"]
    tensors = {f"state/{o}/{slot}": np.zeros((3,), np.float32) for o in owners for slot in ("exp_avg", "exp_avg_sq")}
    tensors |= {f"state/{o}/step": np.array(4.0, np.float32) for o in owners}
    save_file(tensors, str(paths.optimizer_state))
    params = owners if by_name else [0, 1]
    paths.optimizer_param_groups.write_text(json.dumps([{"lr": 1e-5, "params": params}]))
    return paths


def test_the_files_tell_a_0_6_fsdp_run_from_a_ddp_one(tmp_path: Path) -> None:
    fsdp = read_record(lerobot_0_6_step(tmp_path / "fsdp", by_name=True))
    assert fsdp.topology is not None and fsdp.topology.layout is Layout.FSDP and fsdp.sharded is True
    assert fsdp.checkpoint_format == "safetensors" and {"topology", "checkpoint_format"} <= set(fsdp.derived)
    ddp = read_record(lerobot_0_6_step(tmp_path / "ddp", by_name=False))
    assert ddp.topology is not None and ddp.topology.layout is Layout.DDP and ddp.sharded is False
    single = read_record(lerobot_0_6_step(tmp_path / "one", by_name=False, num_processes=1))
    assert single.topology is not None and single.topology.layout is Layout.SINGLE


def test_a_lerobot_run_without_scheduler_needs_no_scheduler_state(tmp_path: Path) -> None:
    paths = layout.StepPaths(tmp_path / "000004")
    paths.pretrained_model.mkdir(parents=True)
    record = TrainingStep.from_dict(main_record(dp_shard=1))
    # configs/train.py: ACT's preset has no scheduler, and train_config.json records "scheduler": null.
    paths.train_config.write_text(json.dumps({"scheduler": None}))
    assert manifest.SCHEDULER_STATE not in manifest.required_parts(manifest.Variant.at(paths, record, peft=False))
    assert not manifest.Resume.at(paths, record, 1, None).scheduler
    assert manifest.Resume.at(paths, record, 4, None).rng  # one RNG state, every rank loads it
    paths.train_config.write_text(json.dumps({"scheduler": {"type": "cosine_decay_with_warmup"}}))
    assert manifest.SCHEDULER_STATE in manifest.required_parts(manifest.Variant.at(paths, record, peft=False))


def test_non_tensor_slots_travel_in_the_tensors_metadata() -> None:
    # LeRobot's save_file takes tensors only: a slot that is not one goes where its readers never look.
    import torch

    from ckpt_tools.format.param_groups import flat_optimizer_files, metadata_scalars, position_names, split_flat_key

    groups = [{"lr": 0.1, "params": ["b.w", "a"]}]
    state = {"a": {"exp_avg": torch.zeros(1), "count": 3}, "b.w": {"exp_avg": torch.zeros(2)}}
    lerobot_groups, tensors, metadata = flat_optimizer_files(groups, state)
    assert lerobot_groups == [{"lr": 0.1, "params": [0, 1]}]  # positions in torch's numbering
    assert set(tensors) == {"state/0/exp_avg", "state/1/exp_avg"}
    names = position_names(metadata, "f")
    scalars = metadata_scalars(metadata, "f")
    assert names == ["b.w", "a"] and scalars == {"state/1/count": 3}
    assert split_flat_key("state/1/count", names) == ("a", "count")
    with pytest.raises(CheckpointError, match="not a list of distinct parameter names"):
        position_names({"ckpt_tools.param_names": '["a", "a"]'}, "f")
