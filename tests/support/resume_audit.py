"""The plan is true: ``reshard-plan``'s per-rank predictions against what the training core read and holds.

A resume writes ``resume_audit/rank<R>.json`` (the read requests torch's DCP reader made, per
file, and the local bytes of parameters, gradients and optimizer state after the load). The
resharding tests of ``tests/train/test_train_resume.py`` ask ``reshard-plan`` first, resume, and
hold every rank's numbers to the plan, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ckpt_tools.resume.plan import ReshardPlan


def audits(output_dir: Path) -> dict[int, dict[str, Any]]:
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
