"""``ckpt-tools reshard-plan`` as a user runs it: no torch, human and JSON output, exit codes."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from ckpt_tools.resume.plan import plan_reshard
from ckpt_tools.resume.target import TargetRequest
from devtools.procs import run_cli
from devtools.training import step_dir
from tests.support.cli import invoke_cli


def test_plan_without_torch_human_and_json_agree_with_the_api(runs: dict[str, Path], tmp_path: Path) -> None:
    src = step_dir(runs["fsdp"], 4)
    out = tmp_path / "onto-hsdp"  # a resume of step 4 into its own run would overwrite 000008
    args = ["reshard-plan", str(src), "--nproc", "4", "--dp-replicate", "2", "--dp-shard", "2"]
    args += ["--checkpoint-format", "dcp", "--batch-size", "4", "--output-dir", str(out)]
    human = run_cli(*args, no_torch=True)
    assert human.returncode == 0, human.stderr
    out = human.stdout
    assert "FSDP over 2 shards" in out and "HSDP over 2×2" in out
    header = next(line for line in out.splitlines() if line.strip().startswith("rank"))
    assert all(col in header for col in ("weights read", "optim read", "params", "grads", "optim state", "resident"))
    assert "KiB" in out and "pytorch_model_fsdp_0/__0_0.distcp" in out
    assert "before     effective batch 16 = batch_size 8 × dp_world_size 2" in out
    assert "after      effective batch 16 = batch_size 4" in out
    assert "data order not sample-exact" in out and "epoch 0, offset 64" in out
    assert "verdict: the resume can work" in out
    machine = invoke_cli(*args, "--json")
    assert machine.returncode == 0, machine.stderr
    doc = json.loads(machine.stdout)
    api = plan_reshard(
        src, TargetRequest(nproc=4, dp_replicate=2, dp_shard=2, checkpoint_format="dcp", batch_size=4, output_dir=out)
    ).to_dict()
    assert doc == json.loads(json.dumps(api))
    assert doc["workable"] and doc["batch_after"]["effective_batch_size"] == 16
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    assert doc["suggestion"]["lr_after"] == doc["suggestion"]["lr_before"]  # same effective batch


def test_plan_says_what_cannot_work(runs: dict[str, Path], tmp_path: Path) -> None:
    proc = run_cli("reshard-plan", str(runs["fsdp"] / "checkpoints"), "--nproc", "1", no_torch=True)
    assert proc.returncode == 1
    assert "Cannot work" in proc.stdout and "≠ world size 1" in proc.stdout and "--dp-shard 1" in proc.stdout
    assert "verdict: CANNOT WORK (1 blocker)" in proc.stdout
    doc = json.loads(invoke_cli("reshard-plan", str(runs["fsdp"]), "--nproc", "1", "--json").stdout)
    assert not doc["workable"] and doc["ranks"] == [] and doc["blockers"][0]["name"] == "topology"


def test_plan_bad_input_is_one_line(runs: dict[str, Path], tmp_path: Path) -> None:
    cases = [
        (["reshard-plan", str(tmp_path / "nothing"), "--nproc", "2"], 3, "no such file or directory"),
        (["reshard-plan", str(tmp_path), "--nproc", "2"], 3, "not a checkpoint"),
        (
            ["reshard-plan", str(runs["fsdp"]), "--nproc", "3", "--dp-replicate", "2", "--dp-shard", "2"],
            2,
            "≠ --nproc 3",
        ),
        (["reshard-plan", str(runs["fsdp"]), "--nproc", "0"], 2, "--nproc=0"),
        (["reshard-plan", str(runs["fsdp"]), "--nproc", "4", "--nnodes", "3"], 2, "--nnodes=3"),
    ]
    # Every case in-process through the same app, the first also as a real process without torch.
    checks = [(invoke_cli(*args), args, code, text) for args, code, text in cases]
    checks.append((run_cli(*cases[0][0], no_torch=True), *cases[0]))
    for proc, args, code, text in checks:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == code, (args, proc.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], (args, proc.stderr)


def test_plan_nodes_note_and_help(runs: dict[str, Path]) -> None:
    doc = json.loads(
        invoke_cli(
            "reshard-plan", str(runs["hsdp"]), "--nproc", "4", "--dp-shard", "4", "--dp-replicate", "1",
            "--nnodes", "2", "--json",
        ).stdout
    )  # fmt: skip
    assert [r["node"] for r in doc["ranks"]] == [0, 0, 1, 1]
    assert any("span nodes" in note for note in doc["notes"])
    helptext = run_cli("reshard-plan", "--help", no_torch=True).stdout
    assert "Examples:" in helptext and "--dp-replicate 2 --dp-shard 2" in helptext and "Exit codes" in helptext


def _peak_bytes(src: Path, nproc: int) -> tuple[int, dict]:
    tracemalloc.start()
    try:
        doc = plan_reshard(src, TargetRequest(nproc=nproc, dp_shard=-1, checkpoint_format="dcp")).to_dict()
        return tracemalloc.get_traced_memory()[1], doc
    finally:
        tracemalloc.stop()


@pytest.mark.timeout(60, func_only=True)
def test_plan_of_a_huge_world_costs_what_a_small_one_does(runs: dict[str, Path]) -> None:
    """A million-process plan is not a million per-rank computations: time and memory do not grow with --nproc."""
    src = step_dir(runs["fsdp"], 8)
    plan_reshard(src, TargetRequest(nproc=2))  # imports and caches out of the measurement
    small_peak, small = _peak_bytes(src, 10)
    huge_peak, huge = _peak_bytes(src, 100_000)
    assert huge_peak < 2 * small_peak, (small_peak, huge_peak)
    # The small world is listed rank by rank, and every rank is in the group holding its numbers.
    assert [r["rank"] for r in small["ranks"]] == list(range(10))
    for rank in small["ranks"]:
        (group,) = [g for g in small["rank_groups"] if any(lo <= rank["rank"] < hi for lo, hi in g["shards"])]
        assert (group["reads"], group["resident"]) == (rank["reads"], rank["resident"])
    # The huge one by groups: every rank counted once, the tail of empty shards reads no weights.
    assert huge["ranks"] == [] and sum(g["count"] for g in huge["rank_groups"]) == 100_000
    tail = max(huge["rank_groups"], key=lambda g: g["count"])
    assert tail["ranks"].endswith("-99999") and tail["resident"]["params"] == 0
    assert not any(r["role"] == "weights" for r in tail["reads"])
    assert any("listed by groups of ranks" in note for note in huge["notes"])
    human = invoke_cli("reshard-plan", str(src), "--nproc", "1000000", "--dp-shard", "-1", "--checkpoint-format", "dcp")
    assert human.returncode == 0, human.stderr
    assert "-999999  " in human.stdout and len(human.stdout.splitlines()) < 200
