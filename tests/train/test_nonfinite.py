"""Non-finite training: NaN data refused at load, a NaN loss stops (or skips), a NaN state is never saved.

One real ``ckpt-train`` run (an lr so large that the second step's loss is NaN) holds the
contract end to end: the skipped updates, the one line, exit code 7, and ``last`` on a finite
checkpoint. The pieces - the guard's count, the commit gate, the dataset checks - are called
in this process.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckpt_tools.errors import ConfigError, ExitCode, NonFiniteError
from ckpt_tools.format.record import Topology, read_training_step
from ckpt_tools.inspect import inspect_path
from ckpt_tools.train.checkpoint.finite import nonfinite_names
from ckpt_tools.train.checkpoint.manager import CheckpointManager
from ckpt_tools.train.data.dataset import load_dataset
from ckpt_tools.train.loop import build_state
from ckpt_tools.train.nonfinite import NonFiniteGuard
from ckpt_tools.train.parallel.distributed import DistEnv
from ckpt_tools.train.parsing import parse_train_config
from devtools.training import FIXTURE_DATASET, TINY, events, gathered_weights, step_dir, train

SINGLE = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


# ====================================================================== the run


def test_a_nan_loss_skips_then_stops_and_last_stays_finite(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # lr 1e20: the first update leaves weights near 1e20 (finite), the second step's loss is NaN.
    proc = train(
        *TINY, "--steps=6", "--save_freq=1", "--optimizer.lr=1e20", "--max_nonfinite_steps=2", f"--output_dir={out}"
    )
    assert proc.returncode == ExitCode.NON_FINITE == 7, proc.stdout[-2000:]
    line = one_error_line(proc.stderr)
    assert line.startswith("error: step 4: the loss is nan; training stopped (after 2 skipped updates")
    assert f"last complete checkpoint: {step_dir(out, 3)}" in line
    assert "warning: step 2: the loss is nan; update skipped (1 of --max_nonfinite_steps=2)" in proc.stdout
    assert [e["step"] for e in events(out, "skipped_update")] == [2, 3]
    root = out / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["000001", "000002", "000003", "last"]
    assert os.readlink(root / "last") == "000003"
    # A skipped update changed nothing: the weights and the optimizer state are step 1's.
    first = gathered_weights(out, 1)
    for step in (2, 3):
        assert all(torch.equal(first[k], v) for k, v in gathered_weights(out, step).items())
        record = read_training_step(step_dir(out, step) / "training_state" / "training_step.json")
        assert record.optimizer_steps == 1 and record.step == step
    report = inspect_path(root, check_values=True)
    assert report.healthy and not report.nonfinite, [c for c in report.checks if c.failed]


# ====================================================================== the guard


def test_the_guard_skips_up_to_the_limit_then_stops() -> None:
    guard = NonFiniteGuard(SINGLE, max_skips=1)
    guard.observe(0.5)
    assert guard.agree(grad_norm=1.0) is None
    guard.observe(float("inf"))
    guard.observe(float("nan"))  # the window's first non-finite loss is the one reported
    reason = guard.agree(grad_norm=float("nan"))
    assert reason == "the loss is inf"
    assert guard.skip_or_stop(5, reason, lambda: "x") == (
        "warning: step 5: the loss is inf; update skipped (1 of --max_nonfinite_steps=1)"
    )
    assert guard.agree(grad_norm=float("inf")) == "the gradient norm is inf"  # the loss was reset
    assert guard.agree(grad_norm=None) is None  # a loss scaler judges the gradients
    with pytest.raises(NonFiniteError) as stopped:
        guard.skip_or_stop(6, "the gradient norm is inf", lambda: "ckpt/000004")
    assert stopped.value.exit_code == 7
    assert str(stopped.value).startswith(
        "step 6: the gradient norm is inf; training stopped (after 1 skipped updates, the most"
        " --max_nonfinite_steps=1 allows); last complete checkpoint: ckpt/000004"
    )


def test_the_default_stops_at_the_first() -> None:
    guard = NonFiniteGuard(SINGLE, max_skips=0)
    guard.observe(float("nan"))
    with pytest.raises(NonFiniteError, match=r"^step 1: the loss is nan; training stopped \(its update was not"):
        guard.skip_or_stop(1, guard.agree(grad_norm=1.0) or "", lambda: "none")


# ====================================================================== the commit gate


def test_a_state_holding_nan_is_not_saved_and_last_stays(tmp_path: Path) -> None:
    """The real save path of a one-process run, in this process: step 1 saved, a NaN, step 2 refused."""
    out = tmp_path / "run"
    cfg, _ = parse_train_config([*TINY, "--steps=4", f"--output_dir={out}"])
    cfg.validate()
    state, _, _ = build_state(cfg, SINGLE, Topology(1, 1, 1, 1))
    manager = CheckpointManager(state)
    assert manager.save(1).path == out / "checkpoints" / "000001"
    name, param = next(iter(state.parallel.inner.named_parameters()))
    with torch.no_grad():
        param.view(-1)[3] = float("inf")
    with pytest.raises(NonFiniteError) as refused:
        manager.save(2)
    checked = sum(1 for _ in state.parallel.inner.parameters()) * 4  # each weight, exp_avg, exp_avg_sq, step
    assert str(refused.value) == (
        f"step 2: checkpoint not saved: 1 of {checked} tensors hold NaN or infinite values (model.{name});"
        f" last complete checkpoint: {out / 'checkpoints' / '000001'} (lower --optimizer.lr or check the dataset)"
    )
    root = out / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["000001", "last"]  # nothing written, not even hidden
    assert os.readlink(root / "last") == "000001"


def test_the_gate_flags_exactly_the_tensors_holding_nan_or_inf() -> None:
    """A sum screens each tensor; one whose sum overflows though every value is finite is not flagged."""
    model = {
        "huge": torch.full((10,), 3e38),  # finite; its float32 sum is inf
        "half": torch.full((1000,), 60000.0, dtype=torch.float16),  # finite; an fp16 sum would overflow
        "ints": torch.arange(5),
        "nan": torch.tensor([1.0, float("nan")]),
    }
    optimizer = {"state": {"w": {"exp_avg_sq": torch.tensor([0.0, float("-inf")]), "step": torch.tensor(2.0)}}}
    bad, total = nonfinite_names(SINGLE, {"model": model, "optimizer": optimizer})
    assert (bad, total) == (["model.nan", "optimizer.state.w.exp_avg_sq"], 5)
    assert nonfinite_names(SINGLE, {"model": {k: v for k, v in model.items() if k != "nan"}}) == ([], 2)


# ====================================================================== the dataset


def dataset_copy(tmp_path: Path) -> Path:
    root = tmp_path / "dataset"
    shutil.copytree(FIXTURE_DATASET, root)
    return root


def test_nan_or_constant_statistics_are_refused_naming_the_feature(tmp_path: Path) -> None:
    root = dataset_copy(tmp_path)
    stats_path = root / "meta" / "stats.json"
    pristine = json.loads(stats_path.read_text())
    for column, key, index, value, said in (
        ("action", "std", 3, 0.0, "action.std[3]=0.0: must be a finite number above 0"),
        ("observation.state", "mean", 0, math.nan, "observation.state.mean[0]=nan: must be a finite number"),
    ):
        stats = json.loads(json.dumps(pristine))
        stats[column][key][index] = value
        stats_path.write_text(json.dumps(stats))  # NaN as JSON's NaN token, which json reads back
        with pytest.raises(ConfigError) as refused:
            load_dataset(root, chunk_size=10)
        assert str(refused.value) == f"dataset {root}: meta/stats.json: {said}"


def test_nan_frames_are_refused_at_load(tmp_path: Path) -> None:
    root = dataset_copy(tmp_path)
    frames_path = root / "data" / "frames.safetensors"
    columns = load_file(str(frames_path))
    columns["action"][1234, 2] = float("nan")
    columns["action"][2000, 0] = float("-inf")
    save_file(columns, str(frames_path))
    episode = int(columns["episode_index"][1234])
    with pytest.raises(ConfigError) as refused:
        load_dataset(root, chunk_size=10)
    assert str(refused.value) == (
        f"dataset {root}: data/frames.safetensors: action is NaN or infinite in 2 frame(s)"
        f" (first: frame 1234, episode {episode}); fix or drop those frames"
    )
