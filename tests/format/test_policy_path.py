"""``--policy.path``: the one resolver the trainer and the resume checks share."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_tools.errors import CheckpointError
from ckpt_tools.format import layout as L
from ckpt_tools.format.layout import is_hub_id
from ckpt_tools.format.policy_path import adapter_refusal, locate_policy, policy_weights
from ckpt_tools.format.rules.startup import saved_format


@pytest.mark.parametrize(
    ("path", "hub"),
    [("lerobot/pi0", True), ("./pi0", False), ("/abs/pi0", False), ("~/pi0", False), ("pi0", False), ("a/b/c", False)],
)
def test_hub_ids_are_user_slash_name(path: str, hub: bool) -> None:
    assert is_hub_id(path) is hub


def test_locate_a_local_dir_a_hub_id_and_neither(tmp_path: Path) -> None:
    assert locate_policy(str(tmp_path)) == tmp_path
    assert locate_policy("lerobot/pi0") == "lerobot/pi0"
    with pytest.raises(CheckpointError, match=r"^\./missing/x: no such directory"):
        locate_policy("./missing/x")
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="not a directory"):
        locate_policy(str(tmp_path / "file"))


def test_the_full_model_wins_over_an_adapter(tmp_path: Path) -> None:
    assert policy_weights(tmp_path) is None
    (tmp_path / L.ADAPTER_WEIGHTS).write_bytes(b"")
    adapter = policy_weights(tmp_path)
    assert adapter is not None and adapter.adapter and adapter.path.name == L.ADAPTER_WEIGHTS
    (tmp_path / L.MODEL_WEIGHTS).write_bytes(b"")
    full = policy_weights(tmp_path)
    assert full is not None and not full.adapter and full.path.name == L.MODEL_WEIGHTS


@pytest.mark.parametrize("fmt", list(L.CheckpointFormat))
def test_a_non_sharded_run_saves_safetensors(fmt: L.CheckpointFormat) -> None:
    assert saved_format(fmt, sharded=True) is fmt
    assert saved_format(fmt, sharded=False) is L.CheckpointFormat.SAFETENSORS


def test_a_peft_adapter_is_refused_as_a_starting_policy(tmp_path: Path) -> None:
    """What to pass instead: the base the adapter records, with --peft.*; or, in a step dir, a resume."""
    step = tmp_path / "run" / "checkpoints" / "000004"
    adapter = step / L.PRETRAINED_MODEL_DIR
    adapter.mkdir(parents=True)
    (step / L.TRAINING_STATE_DIR).mkdir()
    (adapter / L.ADAPTER_WEIGHTS).write_bytes(b"")
    (adapter / L.ADAPTER_CONFIG).write_text('{"base_model_name_or_path": "/runs/base/pretrained_model"}')
    assert adapter_refusal("run/checkpoints/last", adapter) == (
        f"--policy.path=run/checkpoints/last: a PEFT adapter ({L.ADAPTER_WEIGHTS}), not a full policy; to train an"
        " adapter on its base pass --policy.path=/runs/base/pretrained_model with --peft.method_type=LORA"
        f" --peft.r=N, or continue it with --resume=true --config_path={step}"
    )
    converted = tmp_path / "converted"  # convert-dcp's output: no training state, no recorded base
    converted.mkdir()
    (converted / L.ADAPTER_WEIGHTS).write_bytes(b"")
    line = adapter_refusal(str(converted), converted)
    assert line is not None and line.endswith(
        "pass its base policy as --policy.path with --peft.method_type=LORA --peft.r=N"
    )
    (adapter / L.MODEL_WEIGHTS).write_bytes(b"")  # full weights: a policy
    assert adapter_refusal(str(adapter), adapter) is None
