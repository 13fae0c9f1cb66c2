"""What torch really does with the layouts ``parallelize`` builds, from one 2-rank launch of
tests/support/parallel_probe.py: FSDP2's options, and DDP's gradient buckets."""

from __future__ import annotations

import json
import subprocess

import pytest

from devtools.procs import REPO, launch_env, torchrun_command

pytestmark = pytest.mark.torchrun

FSDP_DEFAULT: dict[str, object] = {}
FSDP_KEPT = {"reshard_after_forward": False, "cpu_offload": True}
DDP = {"ddp": True}


@pytest.fixture(scope="module")
def probed() -> list[dict[str, object]]:
    configs = [FSDP_DEFAULT, FSDP_KEPT, DDP]
    cmd = torchrun_command(str(REPO / "tests/support/parallel_probe.py"), [json.dumps(c) for c in configs], nproc=2)
    proc = subprocess.run(cmd, env=launch_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == len(configs), proc.stdout
    return reports


def test_fsdp_options_change_what_fsdp_does(probed: list[dict[str, object]]) -> None:
    default, kept, _ = probed
    assert default["sharded_before_forward"] and default["sharded_after_forward"]
    assert default["local_numel"] * 2 == default["full_numel"]  # type: ignore[operator]
    assert kept["sharded_before_forward"] and not kept["sharded_after_forward"]  # params stay gathered
    assert kept["offload_policy"] == "CPUOffloadPolicy" and kept["params_offloaded"]
    assert not default["params_offloaded"]


def test_ddp_keeps_its_initial_gradient_buckets(probed: list[dict[str, object]]) -> None:
    """A resumed DDP run must all-reduce in the same buckets as the uninterrupted one. torch's
    default DDP rebuilds them after a process's first iteration, so the first step after a resume
    would use other buckets than the run it continues (on more than two ranks, sums in another
    order: not bit-exact); the trainer's DDP never rebuilds."""
    ddp = probed[2]
    assert ddp["default_ddp_rebuilt_buckets"] is True  # the probe sees a rebuild where there is one
    assert ddp["trainer_ddp_rebuilt_buckets"] is False
