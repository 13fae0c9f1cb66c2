"""convert-dcp and inspect on checkpoints other producers wrote: bit-identical to torch's own reader, torch blocked.

The inputs are committed fixtures, written by the producers' real save code
(fixtures/producers/*/README.md, bin/make-producer-fixtures):

- ``torchtitan/checkpoint/``: torchtitan 0.3.0's CheckpointManager, FSDP2 over 3 ranks;
  ``step-2/`` a full training checkpoint (model entries at the top level next to ``optimizer``,
  ``lr_scheduler``, ``dataloader``, ``train_state``), ``step-4/`` the model-only last step;
- ``dcp_tutorial/checkpoint/``: PyTorch's DCP recipe, ``{"app": {"model": ..., "optim": ...}}``.

The reference is torch's ``dcp_to_torch_save`` (then ``torch.load``), in this process; the tool
runs in a process where importing torch fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tools.convert import convert_dcp
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.errors import CheckpointError, UsageError
from ckpt_tools.format import layout as L
from devtools.procs import run_cli
from tests.support.cli import invoke_cli
from tests.support.dcp_fixtures import copy_tree, torch_reference
from tests.support.producers import PRODUCERS, convert_without_torch, same_bits

TITAN = PRODUCERS / "torchtitan" / "checkpoint"
TUTORIAL = PRODUCERS / "dcp_tutorial" / "checkpoint"
TITAN_STATES = {"optimizer", "lr_scheduler", "dataloader", "train_state"}  # torchtitan's non-model entries


@pytest.fixture(scope="module")
def refs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    scratch = tmp_path_factory.mktemp("producer-refs")
    return {name: torch_reference(path, scratch) for name, path in _inputs().items()}


def _inputs() -> dict[str, Path]:
    return {"step-2": TITAN / "step-2", "step-4": TITAN / "step-4", "tutorial": TUTORIAL}


def assert_identical(got: dict[str, torch.Tensor], ref: dict[str, Any]) -> None:
    tensors = {k: v for k, v in ref.items() if isinstance(v, torch.Tensor)}
    assert sorted(got) == sorted(tensors)
    for name, tensor in tensors.items():
        assert same_bits(got[name], tensor), name


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# Conversions run by the API in one torch-blocked process: name -> (fixture, options).
CONVERSIONS = {
    "titan-full": ("step-2", {}),
    "titan-optimizer": ("step-2", {"what": "optimizer"}),
    "tutorial": ("tutorial", {}),
    "tutorial-key": ("tutorial", {"key": "app.model"}),
    "tutorial-optimizer": ("tutorial", {"what": "optimizer"}),
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("producer-out")
    jobs = {
        name: {"checkpoint_dir": str(_inputs()[src]), "output": str(out / name), **options}
        for name, (src, options) in CONVERSIONS.items()
    }
    results = convert_without_torch(jobs)
    assert all("result" in r for r in results.values()), results
    return {
        name: {
            "files": r["result"]["output_files"],
            "notes": r["result"]["notes"],
            **{k: r["result"]["plan"][k] for k in ("what", "selected", "left_out")},
        }
        for name, r in results.items()
    }


def test_the_fixtures_are_what_the_producers_write() -> None:
    """Guard against vacuous tests: torchtitan's top-level layout, its model-only step, uneven shards, the nesting."""
    full = ChunkIndex.load(TITAN / "step-2")
    tops = {str(k) for k in full.top_level_keys()}
    assert tops >= TITAN_STATES and "model" not in tops and "tok_embeddings.weight" in tops
    assert any(
        k.startswith("state.") for k in (str(e.path[1]) for e in full.tensors.values() if e.path[0] == "optimizer")
    )
    model_only = ChunkIndex.load(TITAN / "step-4")
    assert not TITAN_STATES & {str(k) for k in model_only.top_level_keys()}
    rows = sorted(c.sizes[0] for c in model_only.tensors["tok_embeddings.weight"].chunks)
    assert rows == [10, 11, 11] and len(model_only.ranks()) == 3
    tutorial = ChunkIndex.load(TUTORIAL)
    assert {e.path[:2] for e in tutorial.tensors.values()} == {("app", "model"), ("app", "optim")}


def test_torchtitan_root_converts_its_newest_step_like_torch(tmp_path: Path, refs: dict[str, Any]) -> None:
    """``convert-dcp checkpoint/`` (the CLI, no torch): the newest step-N, written inside it."""
    root = copy_tree(TITAN, tmp_path / "checkpoint")
    proc = run_cli("convert-dcp", str(root), "--json", no_torch=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["output_files"] == [str(root / "step-4" / "model.safetensors")]
    assert result["plan"]["selected"] == "" and result["plan"]["left_out"] == []
    assert any("step-4, the newest save" in n for n in result["notes"])
    assert_identical(load_file(root / "step-4" / "model.safetensors"), refs["step-4"])


def test_torchtitan_full_step_gives_the_model_without_its_training_state(
    converted: dict[str, Any], refs: dict[str, Any]
) -> None:
    ref = {k: v for k, v in refs["step-2"].items() if k not in TITAN_STATES}
    got = load_file(converted["titan-full"]["files"][0])
    assert_identical(got, ref)
    assert converted["titan-full"]["left_out"] == sorted(TITAN_STATES)
    notes = " | ".join(converted["titan-full"]["notes"])
    assert "model entries at the top level (left out: dataloader, lr_scheduler, optimizer, train_state)" in notes


def test_torchtitan_optimizer_state_is_torchs(converted: dict[str, Any], refs: dict[str, Any]) -> None:
    got = load_file(converted["titan-optimizer"]["files"][0])
    assert_identical(got, refs["step-2"]["optimizer"])
    assert converted["titan-optimizer"]["what"] == "optimizer"


def test_dcp_recipe_layout_gives_app_model_only(converted: dict[str, Any], refs: dict[str, Any]) -> None:
    """``{"app": {"model", "optim"}}``: the 4 weights, and none of the 12 optimizer tensors next to them."""
    ref = refs["tutorial"]["app"]
    auto = load_file(converted["tutorial"]["files"][0])
    assert_identical(auto, ref["model"])
    assert "converting 'app.model', the model state" in converted["tutorial"]["notes"]
    assert converted["tutorial"]["selected"] == converted["tutorial-key"]["selected"] == "app.model"
    assert converted["tutorial-optimizer"]["selected"] == "app.optim"
    by_key = load_file(converted["tutorial-key"]["files"][0])
    assert_identical(by_key, ref["model"])
    optimizer = load_file(converted["tutorial-optimizer"]["files"][0])
    assert_identical(optimizer, {f"state.{k}": v for k, v in flat(ref["optim"]["state"]).items()})


def test_a_key_of_optimizer_state_is_never_written_as_weights(tmp_path: Path) -> None:
    proc = invoke_cli("convert-dcp", str(TUTORIAL), "--key", "app.optim", "--what", "model", "-o", str(tmp_path))
    assert proc.returncode == 2 and "holds optimizer state (state, param_groups), not weights" in proc.stderr
    proc = invoke_cli("convert-dcp", str(TUTORIAL), "--key", "app.nothing", "-o", str(tmp_path))
    assert proc.returncode == 3
    assert "no subtree 'app.nothing' (its subtrees: app, app.model, app.optim)" in proc.stderr
    assert not list(tmp_path.iterdir())


def _save(directory: Path, state: dict[str, Any]) -> Path:
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "torch.distributed is disabled ... a single process"
        dcp.save(state, checkpoint_id=directory, no_dist=True)
    return directory


def test_two_model_candidates_are_refused_naming_them(tmp_path: Path) -> None:
    w = torch.arange(6.0).reshape(2, 3)
    dcp_dir = _save(
        tmp_path / "distill", {"student": {"w": w}, "teacher": {"w": w * 2}, "optim": {"state": {"w": {"exp_avg": w}}}}
    )
    with pytest.raises(CheckpointError) as e:
        convert_dcp(dcp_dir, dry_run=True, progress=False)
    assert "cannot tell which part holds the model weights: student, teacher; pick one with --key" in str(e.value)
    picked = convert_dcp(dcp_dir, key="teacher", progress=False)
    assert same_bits(load_file(picked.output_files[0])["w"], w * 2)


def test_plain_model_state_dict_still_converts_whole(tmp_path: Path) -> None:
    """``dcp.save(model.state_dict())``: flat weights, nothing to leave out, no note."""
    sd = {"a.weight": torch.ones(2, 2), "b.bias": torch.zeros(3)}
    result = convert_dcp(_save(tmp_path / "flat", sd), progress=False)
    assert sorted(load_file(result.output_files[0])) == sorted(sd) and not result.notes


def test_optimizer_only_checkpoint_is_refused_as_weights(tmp_path: Path) -> None:
    dcp_dir = _save(
        tmp_path / "opt", {"optimizer": {"state": {"w": {"exp_avg": torch.ones(2)}}, "param_groups": [{"lr": 0.1}]}}
    )
    with pytest.raises(CheckpointError, match=r"holds no model weights \(optimizer: training state\)"):
        convert_dcp(dcp_dir, what="model", dry_run=True, progress=False)


def test_sibling_bare_steps_convert_into_themselves(tmp_path: Path) -> None:
    """step-2 then step-4: each output inside its own step, none in the shared parent (which refused the second)."""
    root = copy_tree(TITAN, tmp_path / "checkpoint")
    for step in ("step-2", "step-4"):
        result = convert_dcp(root / step, progress=False)
        assert result.output_files == (root / step / L.MODEL_WEIGHTS,)
    assert not (root / L.MODEL_WEIGHTS).exists()
    with pytest.raises(UsageError, match=r"--delete-dcp refused, nothing deleted: the output .* is inside"):
        convert_dcp(root / "step-2", delete_dcp=True, overwrite=True, progress=False)
    assert (root / "step-2" / L.DCP_METADATA).is_file()


def test_inspect_a_torchtitan_root_and_its_dump_folder() -> None:
    for path in (TITAN, TITAN.parent):
        proc = invoke_cli("inspect", str(path), "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        report = json.loads(proc.stdout)
        assert report["kind"] == "trainer_root" and report["healthy"] is True
        assert [(s["name"], s["step"], s["healthy"]) for s in report["steps"]] == [
            ("step-2", 2, True),
            ("step-4", 4, True),
        ]
        assert report["inspected_step"] == "step-4" and report["weights"][0]["tensors"] == 12
    human = invoke_cli("inspect", str(TITAN))
    assert "steps: step-2, step-4" in human.stdout and "newest: step-4" in human.stdout


def test_inspect_reads_torchtitans_full_step_as_plain_data() -> None:
    """Its dataloader state is pickled bytes (protocol 2's _codecs.encode): data, not code."""
    report = json.loads(invoke_cli("inspect", str(TITAN / "step-2"), "--json").stdout)
    assert report["healthy"] is True, [c for c in report["checks"] if c["status"] == "fail"]


def test_a_trainer_root_is_not_a_lerobot_step() -> None:
    with pytest.raises(CheckpointError, match=r"a folder of step-N saves \(torchtitan's\).*newest save is step-4/"):
        L.resolve_step(TITAN)
    assert L.locate(TITAN.parent).kind is L.PathKind.TRAINER_ROOT
    assert L.newest_trainer_step(TITAN) == TITAN / "step-4"


def test_a_submodule_named_state_is_still_weights(tmp_path: Path) -> None:
    """Only ``param_groups`` marks an optimizer: a policy's ``state`` encoder stays in the weights."""
    sd = {"state.proj.weight": torch.ones(2, 2), "head.weight": torch.zeros(1, 2)}
    for name, state in (("nested", {"model": sd}), ("flat", sd)):
        result = convert_dcp(_save(tmp_path / name, state), progress=False)
        assert sorted(load_file(result.output_files[0])) == sorted(sd), name


def test_an_unfinished_save_is_not_the_newest(tmp_path: Path, refs: dict[str, Any]) -> None:
    """A step-N without .metadata (a save that died) is listed as partial; the newest complete one is taken."""
    root = copy_tree(TITAN, tmp_path / "checkpoint")
    (root / "step-6").mkdir()
    (root / "step-6" / "__0_0.distcp").write_bytes(b"")
    report = json.loads(invoke_cli("inspect", str(root), "--json").stdout)
    assert report["partial_saves"] == ["step-6"] and report["inspected_step"] == "step-4"
    assert any(c["status"] == "warn" and "step-6" in c["message"] for c in report["checks"])
    result = convert_dcp(root, progress=False)
    assert result.output_files == (root / "step-4" / L.MODEL_WEIGHTS,)
    assert_identical(load_file(result.output_files[0]), refs["step-4"])
