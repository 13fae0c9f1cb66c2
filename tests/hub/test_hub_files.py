"""What a Hub push would upload from a folder, and the folders it refuses - decided before any network call."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from ckpt_tools.errors import CheckpointError, CkptError, UsageError
from ckpt_tools.format import layout
from ckpt_tools.hub import check_repo_id, plan_publish, resolve_publish_folder
from ckpt_tools.hub.push import prepare_push
from ckpt_tools.inspect import inspect_path
from devtools.procs import run_cli
from devtools.training import step_dir
from tests.support.hub_data import PUBLISHED, PUBLISHED_PEFT, make_step_dir


def test_step_dir_publishes_only_top_level_weights_and_json(tmp_path: Path) -> None:
    step = make_step_dir(tmp_path)
    plan = plan_publish(step.pretrained_model)
    assert tuple(f.name for f in plan.files) == PUBLISHED
    assert set(plan.skipped) == {"pytorch_model_fsdp_0/", ".model.safetensors.x1y2.tmp", "notes.txt"}
    assert [f.name for f in plan.weights] == ["model.safetensors"]
    assert plan.weights[0].dtypes == ("F32",)
    assert plan.weights[0].num_values == 64 * 32 + 64 + 8 * 64
    assert plan.training_step_path == step.training_state / layout.TRAINING_STEP


def test_peft_step_dir_publishes_the_adapter(tmp_path: Path) -> None:
    step = make_step_dir(tmp_path, peft=True)
    assert tuple(f.name for f in plan_publish(step.pretrained_model).files) == PUBLISHED_PEFT


def test_paths_a_user_may_type_resolve_to_the_pretrained_model_dir(tmp_path: Path) -> None:
    step = make_step_dir(tmp_path)
    pm = step.pretrained_model
    assert resolve_publish_folder(pm) == pm
    assert resolve_publish_folder(step.root) == pm
    assert resolve_publish_folder(step.checkpoints).resolve() == pm.resolve()  # via `last`
    assert resolve_publish_folder(step.output_dir).resolve() == pm.resolve()  # the dir holding checkpoints/
    with pytest.raises(UsageError, match=r"holds training state .*, not a model; it is never published"):
        plan_publish(resolve_publish_folder(step.training_state))
    with pytest.raises(UsageError, match="must be a directory"):
        resolve_publish_folder(pm / "model.safetensors")
    with pytest.raises(CheckpointError, match="no such directory"):
        resolve_publish_folder(tmp_path / "missing")


def test_dcp_only_checkpoint_is_refused_with_the_conversion_to_run(tmp_path: Path) -> None:
    pm = make_step_dir(tmp_path).pretrained_model
    for f in pm.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(CheckpointError, match=r"only as DCP shards \(pytorch_model_fsdp_0/\).*convert-dcp"):
        plan_publish(pm)


def test_folder_without_weights_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="nothing to publish"):
        plan_publish(tmp_path)


def test_truncated_safetensors_is_refused(tmp_path: Path) -> None:
    pm = make_step_dir(tmp_path).pretrained_model
    weights = pm / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match="not a complete safetensors file"):
        plan_publish(pm)


def test_sharded_index_naming_a_missing_shard_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"type": "act"}')
    save_file({"a": np.zeros(3, np.float32)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    index = {
        "metadata": {},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002\.safetensors"):
        plan_publish(tmp_path)
    save_file({"b": np.zeros(3, np.float32)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    assert len(plan_publish(tmp_path).weights) == 2


def test_push_and_inspect_refuse_a_shard_name_that_is_a_path(tmp_path: Path) -> None:
    """One index reader: a shard outside the folder is refused by push and failed by inspect alike."""
    pm = tmp_path / layout.PRETRAINED_MODEL_DIR
    pm.mkdir()
    save_file({"a": np.zeros(3, np.float32)}, str(pm / "model-00001-of-00001.safetensors"))
    index = {"metadata": {}, "weight_map": {"a": "../model-00001-of-00001.safetensors"}}
    (pm / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="is not a plain file name") as refused:
        plan_publish(pm)
    report = inspect_path(pm)
    assert not report.healthy
    assert str(refused.value) in [c.message for c in report.checks if c.status == "fail"]


def test_malformed_json_is_refused(tmp_path: Path) -> None:
    pm = make_step_dir(tmp_path).pretrained_model
    (pm / "config.json").write_text('{"type": "act",')
    with pytest.raises(CheckpointError, match=r"config.json: not valid JSON"):
        plan_publish(pm)


def test_link_to_a_file_outside_the_folder_is_refused(tmp_path: Path) -> None:
    pm = make_step_dir(tmp_path).pretrained_model
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    (pm / "extra.json").symlink_to(outside)
    with pytest.raises(CheckpointError, match="outside"):
        plan_publish(pm)
    (pm / "extra.json").unlink()
    (pm / "alias.json").symlink_to("config.json")  # inside the folder: fine
    assert "alias.json" in {f.name for f in plan_publish(pm).files}


def test_a_file_holding_the_token_is_refused_without_echoing_it(tmp_path: Path) -> None:
    pm = make_step_dir(tmp_path).pretrained_model
    token = "hf_" + "ab12" * 8
    config = json.loads((pm / "train_config.json").read_text())
    config["hub_token"] = token
    (pm / "train_config.json").write_text(json.dumps(config))
    plan = plan_publish(pm)
    with pytest.raises(CheckpointError, match="contains your Hugging Face token") as err:
        plan.refuse_secrets((token,))
    assert token not in str(err.value)
    plan.refuse_secrets(("hf_" + "cd34" * 8,))  # another token: nothing to refuse


@pytest.mark.parametrize("repo_id", ["alice", "alice/", "/model", "a/b/c", "alice/my model", "alice/-x", "al..ice/x"])
def test_malformed_repo_ids_are_refused(repo_id: str) -> None:
    with pytest.raises(UsageError, match="--repo-id"):
        check_repo_id(repo_id)


def test_cli_refusals_are_one_line_with_their_exit_code(tmp_path: Path) -> None:
    pm = make_step_dir(tmp_path).pretrained_model
    before = sorted(os.listdir(pm))
    bad_id = run_cli("push", str(pm), "--repo-id", "not-a-repo-id", no_torch=True)
    for f in pm.glob("*.safetensors"):
        f.unlink()
    dcp_only = run_cli("push", str(pm), "--repo-id", "alice/act", no_torch=True)
    assert bad_id.returncode == 2 and dcp_only.returncode == 3
    for proc in (bad_id, dcp_only):
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
        assert "Traceback" not in proc.stderr
    assert "convert-dcp" in dcp_only.stderr
    assert sorted(os.listdir(pm)) == [n for n in before if not n.endswith(".safetensors")]


def test_push_of_a_100k_deep_config_json_exits_3_with_one_line(tmp_path: Path) -> None:
    pm = tmp_path / "pretrained_model"
    pm.mkdir()
    save_file({"w": np.zeros((4, 4), np.float32)}, str(pm / "model.safetensors"))
    (pm / "config.json").write_text("[" * 100_000)
    proc = run_cli("push", str(pm), "--repo-id", "alice/x", no_torch=True)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr == f"error: {pm / 'config.json'}: not valid JSON (JSON nested too deeply)\n"
    assert proc.stdout == ""


def _ddp_step(runs: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of a real trainer checkpoint (DDP, gathered model.safetensors): publishable as it is."""
    step = tmp_path / "checkpoints" / "000008"
    shutil.copytree(step_dir(runs["ddp"], 8), step)
    return step


def test_a_folder_is_published_for_what_it_holds_not_its_name(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cd training_state && ckpt-tools push .``: RNG, scheduler and optimizer state are never a model."""
    step = _ddp_step(runs, tmp_path)
    ts = step / layout.TRAINING_STATE_DIR
    (ts / layout.TRAINING_STEP).unlink()  # a save that died before its record: nothing names it by content either
    monkeypatch.chdir(ts)
    with pytest.raises(UsageError, match=r"^\.: holds training state \(optimizer_param_groups.json.*not a model"):
        plan_publish(resolve_publish_folder("."))
    renamed = tmp_path / "exported"  # a model under any name is a model
    shutil.copytree(step / layout.PRETRAINED_MODEL_DIR, renamed)
    assert {f.name for f in plan_publish(renamed).weights} == {"model.safetensors"}
    (renamed / layout.POLICY_CONFIG).unlink()
    with pytest.raises(CheckpointError, match=r"holds model weights but no config\.json"):
        plan_publish(renamed)
    with pytest.raises(UsageError) as refused:  # the whole local stage of `ckpt-tools push .`: exit 2, one line
        prepare_push(".", "alice/x")
    assert refused.value.exit_code == 2 and "\n" not in str(refused.value)


BIG = "9" * 3000  # parses (under Python's 4300-digit limit), but a product of two cannot be printed


def _header(shape: str) -> bytes:
    body = ('{"w":{"dtype":"F32","shape":' + shape + ',"data_offsets":[0,4]}}').encode()
    return struct.pack("<Q", len(body)) + body + bytes(4)


def _edit_json(path: Path, **values: object) -> None:
    doc = json.loads(path.read_text())
    for dotted, value in values.items():
        node = doc
        *parents, last = dotted.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    path.write_text(json.dumps(doc))


HOSTILE = {
    "config.json nested 100k deep": lambda pm: (pm / "config.json").write_text("[" * 100_000),
    "train_config.json 5000-digit steps": lambda pm: (pm / "train_config.json").write_text(
        '{"steps": ' + "7" * 5000 + "}"
    ),
    "mesh of 3000-digit sizes": lambda pm: (
        _edit_json(pm / "train_config.json", parallelism__dp_replicate=int(BIG), parallelism__dp_shard=int(BIG)),
        (pm.parent / layout.TRAINING_STATE_DIR / layout.TRAINING_STEP).unlink(),
    ),
    "shape [Infinity]": lambda pm: (pm / "model.safetensors").write_bytes(_header("[Infinity]")),
    "shape [true]": lambda pm: (pm / "model.safetensors").write_bytes(_header("[true]")),
    "shape of two 3000-digit sizes": lambda pm: (pm / "model.safetensors").write_bytes(_header(f"[{BIG},{BIG}]")),
    "shape overflowing 2**64 elements": lambda pm: (pm / "model.safetensors").write_bytes(
        _header("[4294967296, 4294967296, 4294967296]")
    ),
    "shape of a 5000-digit size": lambda pm: (pm / "model.safetensors").write_bytes(_header("[" + "9" * 5000 + "]")),
}


@pytest.mark.parametrize("damage", sorted(HOSTILE))
def test_hostile_json_and_headers_are_one_line_and_exit_3(runs: dict[str, Path], tmp_path: Path, damage: str) -> None:
    pm = _ddp_step(runs, tmp_path) / layout.PRETRAINED_MODEL_DIR
    HOSTILE[damage](pm)
    with pytest.raises(CkptError) as refused:  # the whole local stage of `ckpt-tools push`, before any network call
        prepare_push(pm.parent, "alice/x")
    message = str(refused.value)
    assert refused.value.exit_code == 3 and "\n" not in message and len(message) < 400, message
    assert message.startswith(str(pm)), message
