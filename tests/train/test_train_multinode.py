"""Multi-node runs on torchrun's c10d rendezvous: two agents on loopback stand in for two machines.

HSDP across nodes is the layout that matters: dp_replicate=2 across the nodes, dp_shard=2 inside
each, so the shard collectives (all-gather, reduce-scatter) stay node-local and only the replica
all-reduce crosses. The two-node run must equal the one-node run of the same flags bit for bit
(the session fixture ``runs["hsdp"]``: 4 workers on one agent), record its node count, and agree
with what ``reshard-plan --nnodes`` predicts.
"""

from __future__ import annotations

import json
from pathlib import Path

from ckpt_tools.format.record import read_training_step
from devtools.procs import run_cli
from devtools.training import LAYOUTS, RUN, state_differences, step_dir, train_multinode

HSDP = LAYOUTS["hsdp"][1]


def _groups_line(stdout: str) -> str:
    (line,) = [line for line in stdout.splitlines() if line.strip().startswith("groups")]
    return line


def test_hsdp_across_two_nodes_equals_one_node_and_keeps_shard_groups_local(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "two-nodes"
    agents = train_multinode(*RUN, *HSDP, f"--output_dir={out}", nnodes=2, nproc_per_node=2)
    for agent in agents:
        assert agent.returncode == 0, agent.stderr[-3000:]
    stdout = "".join(agent.stdout for agent in agents)
    # Measured from the mesh and each rank's GROUP_RANK: rows of the mesh are the shard groups.
    groups = _groups_line(stdout)
    assert "dp_replicate [[0, 2], [1, 3]] crosses nodes" in groups, groups
    assert "dp_shard [[0, 1], [2, 3]] node-local" in groups, groups
    assert "(2 nodes: [0, 1] [2, 3])" in groups, groups
    one_node = _groups_line((runs["hsdp"].parent / "hsdp.stdout").read_text())
    assert "(1 node: [0, 1, 2, 3])" in one_node and "crosses" not in one_node, one_node

    final = step_dir(out, 8)
    record = read_training_step(final / "training_state" / "training_step.json")
    assert record.topology is not None and record.topology.nnodes == 2
    assert record.topology.describe() == "HSDP over 2×2 (dp_replicate×dp_shard), 2 nodes"
    assert state_differences(final, step_dir(runs["hsdp"], 8), tmp_path / "tensors") == []

    plan = run_cli("reshard-plan", str(final), "--nproc", "4", "--nnodes", "2", "--json")
    assert plan.returncode == 0, plan.stderr
    notes = json.dumps(json.loads(plan.stdout))
    assert "each dp_shard group (2 ranks) stays inside one node of 2 processes" in notes, notes


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
    import pytest

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
        *RUN, "--steps=1", f"--output_dir={out}", nnodes=2, nproc_per_node=2, wrappers={1: [*local_disk, str(out)]}
    )
    assert all(agent.returncode != 0 for agent in agents)
    errors = [line for agent in agents for line in agent.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, errors
    assert f"--output_dir={out} is not one shared filesystem: rank 2 on " in errors[0], errors
    assert "rank 3 on " in errors[0] and "rank 1 on" not in errors[0]
    assert not (out / "checkpoints").exists() and not list(out.glob(".ckpt-tools-shared-storage-probe-*"))
