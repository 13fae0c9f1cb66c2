"""Multi-node runs on torchrun's c10d rendezvous: two agents on loopback stand in for two machines.

HSDP across nodes is the layout that matters: dp_replicate=2 across the nodes, dp_shard=2 inside
each, so the shard collectives (all-gather, reduce-scatter) stay node-local and only the replica
all-reduce crosses. DDP and FSDP with one worker per node cross with every collective. Each
layout runs as a restartable job (``--resume=auto`` under ``torchrun --max-restarts=1``) that
loses a worker or a whole node part-way, and must still end bit-identical to the same flags on
one node (the session's ``runs``), record its node count, and agree with what ``reshard-plan
--nnodes`` predicts. A node whose output dir is not the shared one stops the launch in one line.
4 workers over 2 nodes for DDP and FSDP are in the matrix ``bin/bench-recovery`` runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_tools.format.record import read_training_step
from devtools.procs import run_cli
from devtools.reliability import restart_faults as R
from devtools.training import RUN, step_dir, train_multinode
from tests.support.restart_checks import survived


def groups_line(stdout: str) -> str:
    """The banner's ``groups`` line (printed by every launch of the job, restarts included: all alike)."""
    lines = {line.strip() for line in stdout.splitlines() if line.strip().startswith("groups")}
    assert len(lines) == 1, lines
    return lines.pop()


def across_two_nodes(tmp_path: Path, layout: str, fault: str, reference: Path, **kw: object) -> R.RestartTrial:
    trial = R.restart_trial(tmp_path / "two-nodes", layout, fault, reference, nnodes=2, **kw)  # type: ignore[arg-type]
    survived(trial)
    assert trial.resumed_from == [4]
    record = read_training_step(step_dir(tmp_path / "two-nodes", 8) / "training_state" / "training_step.json")
    assert record.topology is not None and record.topology.nnodes == 2
    return trial


def test_hsdp_across_two_nodes_keeps_shard_groups_local_survives_a_lost_node_and_equals_one_node(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """Node 1's agent and workers are killed after the first checkpoint; the agent comes back, the
    rendezvous re-forms, the job resumes and ends on the weights of ``runs["hsdp"]`` (one node, 4 workers)."""
    across_two_nodes(tmp_path, "hsdp", "node-kill", step_dir(runs["hsdp"], 8), seed=7)
    stdout = (tmp_path / "logs" / "two-nodes-node0.out").read_text()
    # Measured from the mesh and each rank's GROUP_RANK: rows of the mesh are the shard groups.
    groups = groups_line(stdout)
    assert "dp_replicate [[0, 2], [1, 3]] crosses nodes" in groups, groups
    assert "dp_shard [[0, 1], [2, 3]] node-local" in groups, groups
    assert "(2 nodes: [0, 1] [2, 3])" in groups, groups
    one_node = groups_line((runs["hsdp"].parent / "hsdp.stdout").read_text())
    assert "(1 node: [0, 1, 2, 3])" in one_node and "crosses" not in one_node, one_node
    final = step_dir(tmp_path / "two-nodes", 8)
    record = read_training_step(final / "training_state" / "training_step.json")
    assert record.topology is not None
    assert record.topology.describe() == "HSDP over 2×2 (dp_replicate×dp_shard), 2 nodes"
    plan = run_cli("reshard-plan", str(final), "--nproc", "4", "--nnodes", "2", "--json")
    assert plan.returncode == 0, plan.stderr
    notes = json.dumps(json.loads(plan.stdout))
    assert "each dp_shard group (2 ranks) stays inside one node of 2 processes" in notes, notes


@pytest.mark.parametrize(
    "layout, fault, groups, topology",
    [
        ("ddp", "worker-kill", "dp [[0, 1]] crosses nodes", "DDP over 2 processes, 2 nodes"),
        ("fsdp", "save-kill", "dp_shard [[0, 1]] crosses nodes", "FSDP over 2 shards, 2 nodes"),
    ],
    ids=["ddp-worker-killed", "fsdp-killed-mid-async-save"],
)
def test_ddp_and_fsdp_across_two_nodes_survive_a_lost_worker_and_equal_one_node(
    runs: dict[str, Path], tmp_path: Path, layout: str, fault: str, groups: str, topology: str
) -> None:
    """One worker per node, so every collective crosses the nodes; node 1's worker dies (FSDP: in
    the middle of an async save). The job ends on the state of the same flags on one node
    (the session's run), bit for bit."""
    kw = {"asynchronous": True, "save_kill_delay_s": 0.0} if fault == "save-kill" else {}
    trial = across_two_nodes(tmp_path, layout, fault, step_dir(runs[layout], 8), seed=11, **kw)
    assert trial.target == "rank1"  # the worker of the second node
    assert groups in groups_line((tmp_path / "logs" / "two-nodes-node0.out").read_text())
    record = read_training_step(step_dir(tmp_path / "two-nodes", 8) / "training_state" / "training_step.json")
    assert record.topology is not None and record.topology.describe() == topology


def _private_mount_possible() -> bool:
    import os
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    return probe.returncode == 0


def test_a_node_that_does_not_share_the_output_dir_stops_the_launch(tmp_path: Path) -> None:
    """Node 1 has its own (tmpfs) disk at the output dir's path, as a machine with a local /data has."""
    if not _private_mount_possible():
        pytest.skip("needs root and unshare(1) for a private mount on the second node")
    out = tmp_path / "run"
    out.mkdir()
    local_disk = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs tmpfs "$0" && exec "$@"',
    ]
    agents = train_multinode(
        *RUN, "--steps=1", f"--output_dir={out}", nnodes=2, nproc_per_node=1, wrappers={1: [*local_disk, str(out)]}
    )
    assert all(agent.returncode != 0 for agent in agents)
    errors = [line for agent in agents for line in agent.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, errors
    assert f"--output_dir={out} is not one shared filesystem: rank 1 on " in errors[0], errors
    assert "rank 0 on" not in errors[0]
    assert not (out / "checkpoints").exists() and not list(out.glob(".ckpt-tools-shared-storage-probe-*"))
