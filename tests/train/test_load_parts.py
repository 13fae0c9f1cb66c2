"""A new run from some parts of a checkpoint: ``--checkpoint.load_from`` + ``--checkpoint.load``.

One 1-process source run (module-scoped, 2 steps) is loaded into a 2-process FSDP2 run, weights
only and weights with the optimizer; a copy with a damaged optimizer file is refused as a resume
and accepted as a weights-only start, and ``verify-resume`` says the same both ways.

The FSDP2 runs train one step at ``--optimizer.lr=1e-38``: AdamW's update (about ``lr / (1 -
beta1)`` per weight) and its decay factor ``1 - lr × weight_decay`` then round away against every
trained weight, so the step-1 checkpoint holds the weights the run started from, bit for bit -
the first-step weights, read back through the run's own save.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_tools.format import layout as L
from ckpt_tools.format.rules import load_parts, save_files
from devtools.training import (
    TINY,
    assert_tensors_equal,
    dcp_optimizer_by_name,
    flat_optimizer_by_name,
    gathered_weights,
    ok,
    step_dir,
    train,
)
from tests.support.cli import invoke_cli
from tests.support.train_cli import run_in_process

FSDP2 = ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors", "--steps=1", "--optimizer.lr=1e-38"]


def record(step: Path) -> dict:
    return json.loads((step / L.TRAINING_STATE_DIR / L.TRAINING_STEP).read_text())


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line.removeprefix("error: ") for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-process run's step-2 checkpoint (flat optimizer state, gathered weights)."""
    out = tmp_path_factory.mktemp("source") / "run"
    ok(train(*TINY, f"--output_dir={out}", "--steps=2", "--save_freq=2", timeout=120))
    return step_dir(out, 2)


@pytest.fixture(scope="module")
def damaged(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the source whose optimizer state is not what its save wrote (same size, other bytes)."""
    step = tmp_path_factory.mktemp("damaged") / "run" / L.CHECKPOINTS_DIR / source.name
    shutil.copytree(source, step)
    optimizer = step / L.TRAINING_STATE_DIR / L.OPTIMIZER_STATE
    data = bytearray(optimizer.read_bytes())
    data[-64:] = bytes(64)  # tensor data: the header still parses
    optimizer.write_bytes(bytes(data))
    return step


def test_the_part_names() -> None:
    assert load_parts.parse(None) == ("model",)
    assert load_parts.parse("optimizer, model") == ("model", "optimizer")
    assert load_parts.parse("all") == load_parts.PART_NAMES
    with pytest.raises(ValueError, match=r"unknown part momentum \(choose from model, optimizer, scheduler"):
        load_parts.parse("model,momentum")


def test_weights_only_into_fsdp2(source: Path, tmp_path: Path) -> None:
    """load=model: the FSDP2 run starts from the 1-process weights, with a fresh optimizer, and says so."""
    out = tmp_path / "new"
    proc = ok(train(*TINY, *FSDP2, f"--checkpoint.load_from={source.parent.parent}", f"--output_dir={out}", nproc=2))
    assert f"initialized from {source} (step 2): model; at step 0" in proc.stdout
    assert_tensors_equal(gathered_weights(out, 1), gathered_weights(source.parent.parent, 2))
    new = record(step_dir(out, 1))
    assert record(source)["adam_step"] == 2 and new["adam_step"] == 1  # a fresh optimizer: one update
    assert new["step"] == 1 and new["samples_seen"] == 16  # step 0 of a new data order
    assert new["initialized_from"] == {
        "path": str(source),
        "step": 2,
        "save_id": save_files.read(L.StepPaths(source)).save_id,
        "parts": ["model"],
    }
    shown = invoke_cli("inspect", str(step_dir(out, 1)))
    assert f"initialized from: {source} (step 2, save " in shown.stdout
    verdict = invoke_cli("verify-resume", str(out), "--skip-build")
    shown_line = next(line for line in verdict.stdout.splitlines() if "initialized-from" in line)
    assert f"this run started at step 0 from {source} (step 2" in shown_line and verdict.returncode == 0


@pytest.fixture(scope="module")
def fsdp_loaded(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """load=model,optimizer from the 1-process source into FSDP2 over 2 processes; its step-1 checkpoint
    holds DCP shards and the gathered file (safetensors_dcp)."""
    out = tmp_path_factory.mktemp("fsdp_loaded") / "run"
    flags = [f"--checkpoint.load_from={source}", "--checkpoint.load=model,optimizer", f"--output_dir={out}"]
    ok(train(*TINY, *FSDP2, "--checkpoint_format=safetensors_dcp", *flags, nproc=2))
    return step_dir(out, 1)


def test_weights_and_optimizer_into_fsdp2(source: Path, fsdp_loaded: Path) -> None:
    """load=model,optimizer: the saved optimizer state goes on (flat files resharded onto FSDP2)."""
    new = record(fsdp_loaded)
    assert new["adam_step"] == 3 and new["optimizer_steps"] == 1  # the source's 2 updates, and this run's one
    assert new["initialized_from"]["parts"] == ["model", "optimizer"]
    assert_tensors_equal(gathered_weights(fsdp_loaded.parent.parent, 1), gathered_weights(source.parent.parent, 2))


def start_in_process(source: Path, tmp_path: Path, load: str) -> Any:
    """The trainer's own build and load of a new 1-process run, in this process; the state before any update."""
    from ckpt_tools.format.record import Topology
    from ckpt_tools.train.checkpoint.load import initialize_from, preflight_load_source
    from ckpt_tools.train.loop import build_state
    from ckpt_tools.train.parallel.distributed import init_distributed
    from ckpt_tools.train.parsing import parse_train_args

    flags = [*TINY, f"--checkpoint.load_from={source}", f"--checkpoint.load={load}", f"--output_dir={tmp_path}"]
    cfg = parse_train_args(flags).cfg
    state, _, _ = build_state(cfg, init_distributed(), Topology(1, 1, 1, 1))
    initialize_from(state, preflight_load_source(str(source), load, cfg.run_settings(), fp16=False))
    assert state.step == 0 and state.sampler.samples_seen == 0 and state.scheduler.last_epoch == 0
    return state


def held_optimizer(state: Any) -> dict[str, torch.Tensor]:
    names = {p: name for name, p in state.parallel.inner.named_parameters()}
    slots = state.optimizer.state.items()
    return {f"state.{names[p]}.{slot}": value for p, by_slot in slots for slot, value in by_slot.items()}


def test_the_loaded_optimizer_state_is_the_saved_one_bit_for_bit(source: Path, tmp_path: Path) -> None:
    """Before any update, a load=model,optimizer run holds the saved optimizer state (flat files) exactly."""
    state = start_in_process(source, tmp_path, "model,optimizer")
    assert_tensors_equal(held_optimizer(state), flat_optimizer_by_name(source))


def test_sharded_dcp_parts_load_into_one_process(fsdp_loaded: Path, tmp_path: Path) -> None:
    """The FSDP2 run's DCP shards (weights and optimizer) reshard onto one process, bit for bit."""
    from ckpt_tools.format import manifest

    assert manifest.choose(manifest.weights_inputs(False), L.StepPaths(fsdp_loaded)) is manifest.MODEL_DCP
    state = start_in_process(fsdp_loaded, tmp_path, "model,optimizer")
    held = {k: v.detach() for k, v in state.parallel.inner.state_dict().items()}
    assert_tensors_equal(held, gathered_weights(fsdp_loaded.parent.parent, 1))
    saved = dcp_optimizer_by_name(fsdp_loaded / L.TRAINING_STATE_DIR / L.OPTIMIZER_DCP_DIR, tmp_path)
    assert_tensors_equal(held_optimizer(state), saved)


def test_a_damaged_optimizer_refuses_the_resume_not_a_weights_only_start(
    damaged: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trainer and verify-resume agree both ways: verdict equals outcome (refusals come before any
    process group, so they are asked of the entry point in this process; the weights-only start really runs)."""
    resume = run_in_process(["--resume=true", f"--config_path={damaged}", f"--output_dir={tmp_path / 'r'}"], capsys)
    assert resume.returncode == 3
    assert "training_state/optimizer_state.safetensors: its content is not what the save wrote" in error_line(resume)
    judged = invoke_cli("verify-resume", str(damaged), "--skip-build")
    assert judged.returncode == 1 and "NOT RESUMABLE" in judged.stdout

    judged = invoke_cli("verify-resume", str(damaged), "--load", "model")
    assert judged.returncode == 0 and "loadable: a new run can start from its model" in judged.stdout
    out = tmp_path / "weights_only"
    ok(train(*TINY, "--steps=1", f"--checkpoint.load_from={damaged}", f"--output_dir={out}", timeout=120))
    assert record(step_dir(out, 1))["initialized_from"]["parts"] == ["model"]

    judged = invoke_cli("verify-resume", str(damaged), "--load", "model,optimizer")
    assert judged.returncode == 1 and "FAIL  load-optimizer" in judged.stdout
    flags = [f"--checkpoint.load_from={damaged}", "--checkpoint.load=model,optimizer", f"--output_dir={tmp_path / 'b'}"]
    both = run_in_process([*TINY, *flags], capsys)
    assert both.returncode == 3
    assert error_line(both) in judged.stdout  # the line verify-resume failed the part with


def test_refusals_and_the_dry_run(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad combinations are one line and exit 2 before anything is built; the dry run checks the load plan."""
    out = tmp_path / "new"
    flags = [*TINY, f"--checkpoint.load_from={source}", f"--output_dir={out}"]
    unknown = run_in_process([*flags, "--checkpoint.load=model,momentum"], capsys)
    assert unknown.returncode == 2
    assert error_line(unknown) == (
        "--checkpoint.load=model,momentum: unknown part momentum (choose from model, optimizer, scheduler, scaler,"
        " rng, all)"
    )
    both = run_in_process(["--resume=true", f"--config_path={source}", f"--checkpoint.load_from={source}"], capsys)
    assert both.returncode == 2 and "--resume=true continues its own: pass one of them" in error_line(both)
    lora = run_in_process([*flags, f"--policy.path={source}", "--peft.r=4"], capsys)
    assert lora.returncode == 2 and f"pass --policy.path={source} instead" in error_line(lora)

    dry = run_in_process([*flags, "--dry_run=true"], capsys)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "pass  load-plan      model from" in dry.stdout and not out.exists()
    other = run_in_process([*flags, "--policy.dim_model=16", "--dry_run=true"], capsys)
    assert other.returncode == 3 and "its weights do not fit the model" in error_line(other)
    assert not out.exists()
