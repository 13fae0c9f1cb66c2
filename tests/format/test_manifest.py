"""The checkpoint manifest: which parts each kind of run holds, which container a loader reads,
which state a resume reads, and the one PEFT rule - in-process, on small directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_tools.format import manifest as M
from ckpt_tools.format.layout import CheckpointFormat, StepPaths
from ckpt_tools.format.record import Topology, TrainingStep
from ckpt_tools.format.train_config import SavedConfig

SAFETENSORS, DCP, BOTH = CheckpointFormat.SAFETENSORS, CheckpointFormat.DCP, CheckpointFormat.SAFETENSORS_DCP
UNIVERSAL = {"pretrained_model/config.json", "pretrained_model/train_config.json"}
UNIVERSAL |= {"training_state/rng_state.safetensors", "training_state/training_step.json"}


def required(variant: M.Variant | None) -> set[str]:
    return {f for part in M.required_parts(variant) for f in part.required_files()}


def keys(parts: tuple[M.Part, ...]) -> list[str]:
    return [p.key for p in parts]


# ---------------------------------------------------------------------- required parts


@pytest.mark.parametrize(
    ("fmt", "sharded", "weights"),
    [
        (SAFETENSORS, False, {"pretrained_model/model.safetensors"}),
        (DCP, False, {"pretrained_model/model.safetensors"}),  # nothing to shard: one file whatever the format
        (SAFETENSORS, True, {"pretrained_model/model.safetensors"}),
        (DCP, True, {"pretrained_model/pytorch_model_fsdp_0/.metadata"}),
        (BOTH, True, {"pretrained_model/model.safetensors", "pretrained_model/pytorch_model_fsdp_0/.metadata"}),
    ],
)
def test_weights_follow_format_and_sharding(fmt: CheckpointFormat, sharded: bool, weights: set[str]) -> None:
    files = required(M.Variant(fmt, sharded))
    all_weights = {"pretrained_model/model.safetensors", "pretrained_model/pytorch_model_fsdp_0/.metadata"}
    assert files & (all_weights | {"pretrained_model/adapter_model.safetensors"}) == weights


def test_optimizer_is_dcp_when_sharded_and_flat_otherwise() -> None:
    sharded, flat = required(M.Variant(DCP, sharded=True)), required(M.Variant(SAFETENSORS, sharded=False))
    assert "training_state/optimizer_0/.metadata" in sharded
    assert not {"training_state/optimizer_state.safetensors", "training_state/optimizer_param_groups.json"} & sharded
    assert {"training_state/optimizer_state.safetensors", "training_state/optimizer_param_groups.json"} <= flat
    assert "training_state/optimizer_0/.metadata" not in flat


def test_peft_holds_the_adapter_and_its_config_instead_of_the_model() -> None:
    peft = required(M.Variant(BOTH, sharded=True, peft=True))
    assert {"pretrained_model/adapter_model.safetensors", "pretrained_model/adapter_config.json"} <= peft
    assert "pretrained_model/model.safetensors" not in peft
    assert "pretrained_model/pytorch_model_fsdp_0/.metadata" in peft  # the adapter's shards
    assert "pretrained_model/adapter_config.json" not in required(M.Variant(BOTH, sharded=True))


def test_only_fp16_holds_a_scaler_state() -> None:
    assert "training_state/scaler_state.json" in required(M.Variant(fp16=True))
    assert "training_state/scaler_state.json" not in required(M.Variant(fp16=False))


def test_every_resumable_checkpoint_holds_the_universal_state() -> None:
    for fmt in CheckpointFormat:
        for sharded in (False, True):
            files = required(M.Variant(fmt, sharded))
            assert UNIVERSAL | {"training_state/scheduler_state.json"} <= files, (fmt, sharded)
            assert not any("processor" in f for f in files)  # written always, never required


def test_legacy_requires_its_gathered_weights_and_nothing_resumable() -> None:
    assert required(M.Variant(DCP, sharded=True, fp16=True, legacy=True)) == UNIVERSAL | {
        "pretrained_model/model.safetensors"
    }


def test_unknown_run_requires_only_the_universal_files() -> None:
    assert required(None) == UNIVERSAL


def test_written_parts_are_the_required_ones_plus_the_processors_with_the_record_last() -> None:
    for variant in (M.Variant(DCP, True, peft=True, fp16=True), M.Variant(BOTH, True), M.Variant()):
        written = M.written_parts(variant)
        assert set(written) == set(M.required_parts(variant)) | {M.PROCESSORS}
        assert written[-1] is M.TRAINING_STEP
        containers = [p for p in written if p.read == M.CHOSEN]
        assert written[: len(containers)] == tuple(containers)  # the weights and optimizer first


def test_variant_of_a_record() -> None:
    record = TrainingStep(step=1, checkpoint_format="dcp", sharded=True, mixed_precision="FP16", peft=True)
    assert M.Variant.of(record, peft=True) == M.Variant(DCP, sharded=True, peft=True, fp16=True)
    older = TrainingStep(step=1, checkpoint_format="something-new", topology=Topology(4, 2, 2))
    assert M.Variant.of(older, peft=False) == M.Variant(SAFETENSORS, sharded=True)  # sharded from the topology
    ddp = TrainingStep(step=1, topology=Topology(4, 4, 1))
    assert M.Variant.of(ddp, peft=False).sharded is False


def test_a_part_names_only_real_conditions() -> None:
    with pytest.raises(ValueError, match="not a Variant condition"):
        M.Part("x", ("training_state/x.json",), "x", "sometimes")
    with pytest.raises(ValueError, match="not a Resume condition"):
        M.Part("x", ("training_state/x.json",), "x", "always", read="rarely")


# ---------------------------------------------------------------------- which container a loader reads


def touch(step: Path, *rels: str) -> None:
    for rel in rels:
        path = step / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


def test_dcp_weights_win_over_the_gathered_file(tmp_path: Path) -> None:
    step = StepPaths(tmp_path)
    inputs = M.weights_inputs(peft=False)
    assert M.choose(inputs, step) is None
    touch(tmp_path, "pretrained_model/model.safetensors")
    assert M.choose(inputs, step) is M.MODEL_WEIGHTS
    (tmp_path / "pretrained_model/pytorch_model_fsdp_0").mkdir()
    assert M.choose(inputs, step) is M.MODEL_WEIGHTS  # shards without .metadata: an incomplete save
    touch(tmp_path, "pretrained_model/pytorch_model_fsdp_0/.metadata")
    assert M.choose(inputs, step) is M.MODEL_DCP


def test_a_peft_loader_reads_the_adapter_file(tmp_path: Path) -> None:
    touch(tmp_path, "pretrained_model/model.safetensors")
    assert M.choose(M.weights_inputs(peft=True), StepPaths(tmp_path)) is None
    touch(tmp_path, "pretrained_model/adapter_model.safetensors")
    assert M.choose(M.weights_inputs(peft=True), StepPaths(tmp_path)) is M.ADAPTER_WEIGHTS
    assert M.gathered_weights(peft=True) is M.ADAPTER_WEIGHTS and M.gathered_weights(peft=False) is M.MODEL_WEIGHTS


def test_dcp_optimizer_wins_over_the_flat_files(tmp_path: Path) -> None:
    step = StepPaths(tmp_path)
    touch(tmp_path, "training_state/optimizer_state.safetensors")
    assert M.choose(M.optimizer_inputs(), step) is M.FLAT_OPTIMIZER
    touch(tmp_path, "training_state/optimizer_0/.metadata")
    assert M.choose(M.optimizer_inputs(), step) is M.OPTIMIZER_DCP


def test_the_dcp_inputs_are_the_chosen_dcp_containers(tmp_path: Path) -> None:
    step = StepPaths(tmp_path)
    touch(tmp_path, "pretrained_model/model.safetensors", "training_state/optimizer_0/.metadata")
    (tmp_path / "pretrained_model/pytorch_model_fsdp_0").mkdir()  # no .metadata: not read, not checked
    assert M.dcp_inputs(step) == (M.OPTIMIZER_DCP,)
    touch(tmp_path, "pretrained_model/pytorch_model_fsdp_0/.metadata")
    assert M.dcp_inputs(step) == (M.MODEL_DCP, M.OPTIMIZER_DCP)


def test_the_reasons_say_what_is_missing(tmp_path: Path) -> None:
    step = StepPaths(tmp_path)
    assert "neither pytorch_model_fsdp_0/ nor adapter_model.safetensors" in M.no_weights_reason(step, peft=True)
    (tmp_path / "pretrained_model/pytorch_model_fsdp_0").mkdir(parents=True)
    assert "did not complete" in M.no_weights_reason(step, peft=False)
    assert "no optimizer state (optimizer_0/ or optimizer_state.safetensors)" in M.no_optimizer_reason(step, False)
    assert "a sharded run's optimizer state is missing" in M.no_optimizer_reason(step, True)
    (tmp_path / "training_state/optimizer_0").mkdir(parents=True)
    assert "the optimizer save did not complete" in M.no_optimizer_reason(step, True)


# ---------------------------------------------------------------------- what a resume reads


def test_resume_reads_rng_only_onto_the_same_world_and_the_scaler_only_in_fp16() -> None:
    record = TrainingStep(step=1, topology=Topology(4, 2, 2))
    same = M.Resume.of(record, world_size=4, mixed_precision="no")
    assert same == M.Resume(same_world=True, fp16=False)
    assert keys(M.resume_reads(same)) == ["rng_state", "train_config", "scheduler_state", "training_step"]
    other = M.Resume.of(record, world_size=2, mixed_precision="fp16")
    assert keys(M.resume_reads(other)) == ["train_config", "scheduler_state", "scaler_state", "training_step"]
    assert M.Resume.of(TrainingStep(step=1), world_size=1, mixed_precision=None).same_world is False  # unknown world


# ---------------------------------------------------------------------- the PEFT rule


def test_peft_rule_takes_the_strongest_evidence(tmp_path: Path) -> None:
    pm = tmp_path / "pretrained_model"
    pm.mkdir()
    lora = ["base_model.model.x.lora_A.weight", "base_model.model.x.lora_B.weight"]
    assert M.is_peft(pm) is False
    assert M.is_peft(pm, weight_names=lora) is True
    assert M.is_peft(pm, weight_names=[*lora, "base_model.model.x.weight"]) is False  # a full model with LoRA keys
    assert M.is_peft(None, weight_names=lora) is True  # a loose DCP dir: the names alone
    (pm / "adapter_config.json").write_text("{}")
    assert M.is_peft(pm) is True
    assert M.is_peft(pm, record=TrainingStep(step=1, peft=False)) is False  # the saving run's word over the files
    assert M.is_peft(pm, record=TrainingStep(step=1)) is True  # a record that does not say: the files
    config = SavedConfig(pm / "train_config.json", {"peft": {"r": 4}})
    assert M.is_peft(pm, config=config, record=TrainingStep(step=1, peft=False)) is True  # the resumed run's config
    no_peft = SavedConfig(pm / "train_config.json", json.loads('{"peft": null}'))
    assert M.is_peft(pm, config=no_peft, record=TrainingStep(step=1, peft=True)) is False
