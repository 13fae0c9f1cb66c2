"""``--policy.path``: the one resolver the trainer and the resume checks share."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_tools.errors import CheckpointError
from ckpt_tools.format import layout as L
from ckpt_tools.format.policy_path import is_hub_id, locate_policy, policy_weights
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
