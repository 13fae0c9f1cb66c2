"""``--checkpoint_async=true``: the same checkpoints as synchronous saves, part for part.

A SIGKILL or SIGTERM in the middle of an async save: tests/reliability/test_reliability_crash.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from devtools.training import (
    TINY,
    assert_tensors_equal,
    dcp_to_dict,
    events,
    gathered_weights,
    ok,
    step_dir,
    train,
    unstamped_json,
)

pytestmark = pytest.mark.torchrun

RUN = [*TINY, "--steps=8", "--save_freq=4", "--log_samples=true"]  # the `runs` fixture's flags


def test_async_checkpoints_equal_sync_ones_and_resume_bit_exactly(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "async"
    flags = ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors_dcp"]
    proc = ok(train(*RUN, *flags, "--checkpoint_async=true", f"--output_dir={out}", nproc=2))
    assert proc.stdout.count("writing in the background") == 2 and proc.stdout.count("committed") == 2
    sync = runs["fsdp"]
    for step in (4, 8):
        assert_tensors_equal(gathered_weights(out, step), gathered_weights(sync, step))
        rel = "pretrained_model/pytorch_model_fsdp_0"
        a, b = dcp_to_dict(step_dir(out, step) / rel, tmp_path), dcp_to_dict(step_dir(sync, step) / rel, tmp_path)
        assert_tensors_equal(a["model"], b["model"])
        rel = "training_state/optimizer_0"
        a, b = dcp_to_dict(step_dir(out, step) / rel, tmp_path), dcp_to_dict(step_dir(sync, step) / rel, tmp_path)
        assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
        for name, slots in a["optimizer"]["state"].items():
            assert_tensors_equal(slots, b["optimizer"]["state"][name])
        rng = "training_state/rng_state.safetensors"  # safetensors metadata order is not stable: compare tensors
        # The per-rank generators are what a resume restores; the py_/np_/torch_ keys are the main
        # process's states at save time, written for LeRobot's reader (ckpt-train draws nothing
        # from Python's or NumPy's global generator, but the background writer's libraries may).
        async_rng, sync_rng = (load_file(str(step_dir(run, step) / rng)) for run in (out, sync))
        assert sorted(async_rng) == sorted(sync_rng)
        assert_tensors_equal(_per_rank(async_rng), _per_rank(sync_rng))
        for rel in ("training_state/training_step.json", "training_state/scheduler_state.json"):  # but the save id
            assert unstamped_json(step_dir(out, step) / rel) == unstamped_json(step_dir(sync, step) / rel), rel
    pauses = [e["pause_s"] for e in events(out, "checkpoint")]
    assert len(pauses) == 2 and len(events(out, "checkpoint_committed")) == 2
    # The host copy of the step-4 save is taken in the background; step 5's update waited for it.
    # (The step-8 save is the last: no update follows, the end of training waits for it instead.)
    assert [e["step"] for e in events(out, "checkpoint_staged")] == [4]
    # Every part equals the synchronous save's, so a resume from it is the synchronous resume
    # (bit-exact: tests/train/test_train_resume.py::test_fsdp_resume_on_same_topology_is_bit_exact).


def _per_rank(states: dict) -> dict:
    """The ``rank{r}.*`` generator states of an ``rng_state.safetensors``."""
    return {key: value for key, value in states.items() if key.startswith("rank")}
