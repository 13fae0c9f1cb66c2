"""The plan is true: reshard-plan's per-rank predictions equal what the training core read and holds.

Each test asks ``verify-resume`` and ``reshard-plan`` about a real checkpoint and target, then
really resumes it there; the training core writes ``resume_audit/rank<R>.json`` (the read
requests torch's DCP reader made, per file, and the local bytes of parameters, gradients and
optimizer state after the load). Every rank's numbers must be equal, byte for byte.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckpt_tools.resume.plan import ReshardPlan, plan_reshard
from ckpt_tools.resume.target import TargetRequest
from ckpt_tools.resume.verify import verify_resume
from devtools.training import ok, step_dir, train

pytestmark = pytest.mark.torchrun  # every test here starts ckpt-train


def resume_args(checkpoint: Path, output_dir: Path, *extra: str) -> list[str]:
    return ["--resume=true", f"--config_path={checkpoint}", f"--output_dir={output_dir}", *extra]


def audits(output_dir: Path) -> dict[int, dict]:
    files = sorted((output_dir / "resume_audit").glob("rank*.json"))
    return {int(f.stem.removeprefix("rank")): json.loads(f.read_text()) for f in files}


def assert_plan_is_true(plan: ReshardPlan, output_dir: Path) -> None:
    measured = audits(output_dir)
    assert sorted(measured) == [r.rank for r in plan.ranks]
    for rank in plan.ranks:
        audit = measured[rank.rank]
        assert (audit["world_size"], audit["dp_replicate"], audit["dp_shard"]) == (
            plan.target.world_size,
            plan.target.dp_replicate,
            plan.target.dp_shard,
        )
        assert rank.dcp_reads() == audit["read"], f"rank {rank.rank}: bytes read"
        predicted = {"params": rank.resident.params, "grads": rank.resident.grads, "optimizer": rank.resident.optimizer}
        assert predicted == audit["resident"], f"rank {rank.rank}: resident bytes"


def test_fsdp_checkpoint_onto_hsdp(runs: dict[str, Path], tmp_path: Path) -> None:
    src = step_dir(runs["fsdp"], 4)
    flags = {"nproc": 4, "dp_replicate": 2, "dp_shard": 2, "checkpoint_format": "dcp"}
    assert verify_resume(src, TargetRequest(**flags)).resumable
    plan = plan_reshard(src, TargetRequest(**flags))
    assert plan.workable and plan.target.layout == "hsdp"
    # Replicas of a shard read the same spans; the two shards split the saved chunks between them.
    assert plan.ranks[0].dcp_reads().keys() == plan.ranks[2].dcp_reads().keys()
    assert plan.ranks[0].resident == plan.ranks[2].resident
    out = tmp_path / "hsdp"
    ok(train(*resume_args(src, out, *_flags(2, 2, "dcp"), "--steps=5"), nproc=4))
    assert_plan_is_true(plan, out)


def test_hsdp_checkpoint_onto_fsdp(runs: dict[str, Path], tmp_path: Path) -> None:
    src = step_dir(runs["hsdp"], 4)
    flags = {"nproc": 2, "dp_replicate": 1, "dp_shard": 2, "checkpoint_format": "safetensors_dcp"}
    assert verify_resume(src, TargetRequest(**flags)).resumable
    plan = plan_reshard(src, TargetRequest(**flags))
    assert plan.workable and not plan.data.sample_exact
    out = tmp_path / "fsdp"
    ok(train(*resume_args(src, out, *_flags(1, 2, "safetensors_dcp"), "--steps=5"), nproc=2))
    assert_plan_is_true(plan, out)


def test_fsdp_checkpoint_without_rng_state_onto_one_process(runs: dict[str, Path], tmp_path: Path) -> None:
    """The RNG state is read only on an unchanged world size: without it, 2 → 1 still resumes."""
    src = tmp_path / "ckpt" / "000004"
    shutil.copytree(step_dir(runs["fsdp"], 4), src)
    (src / "training_state/rng_state.safetensors").unlink()
    same = verify_resume(src)
    assert not same.resumable and [c.name for c in same.failures] == ["rng-state"]
    flags = {"nproc": 1, "dp_shard": 1, "checkpoint_format": "safetensors"}
    assert verify_resume(src, TargetRequest(**flags)).resumable
    plan = plan_reshard(src, TargetRequest(**flags))
    assert plan.workable and plan.target.layout == "single"
    assert [r.dcp_reads() for r in plan.ranks] == [
        {  # one process reads every saved span of both DCP directories, whole files
            f"{d}/{f.name}": f.stat().st_size
            for d in ("pretrained_model/pytorch_model_fsdp_0", "training_state/optimizer_0")
            for f in sorted((src / d).glob("*.distcp"))
        }
    ]
    out = tmp_path / "single"
    ok(train(*resume_args(src, out, *_flags(1, 1, "safetensors"), "--steps=5")))
    assert_plan_is_true(plan, out)


def _flags(r: int, s: int, fmt: str) -> list[str]:
    """The training flags that stand for reshard-plan's --dp-replicate/--dp-shard/--checkpoint-format."""
    return [f"--parallelism.dp_replicate={r}", f"--parallelism.dp_shard={s}", f"--checkpoint_format={fmt}"]
