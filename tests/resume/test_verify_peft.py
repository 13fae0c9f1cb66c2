"""PEFT checkpoints: the plan counts the frozen base the resume rebuilds, and a lost base is caught.

A LoRA run stores only the adapter; on resume the training core rebuilds the base from
``train_config.json``'s ``policy.path`` and shards it with the adapter. So the plan must count
that base as resident (read from its own ``model.safetensors`` header), and verify-resume must
fail when the base is gone - exactly when the training core's resume fails.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckpt_tools.resume.plan import plan_reshard
from ckpt_tools.resume.target import TargetRequest
from ckpt_tools.resume.verify import verify_resume
from devtools.training import TINY, ok, step_dir, train
from tests.support.resume_audit import assert_plan_is_true

pytestmark = pytest.mark.torchrun  # every test here starts ckpt-train


def resume_args(checkpoint: Path, output_dir: Path, *extra: str) -> list[str]:
    return ["--resume=true", f"--config_path={checkpoint}", f"--output_dir={output_dir}", *extra]


@pytest.fixture(scope="module")
def peft_checkpoint(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A single-process LoRA run on top of the DDP run's step-4 policy, saved at step 2."""
    base = step_dir(runs["ddp"], 4) / "pretrained_model"
    run = tmp_path_factory.mktemp("peft") / "run"
    args = [a for a in TINY if not a.startswith("--policy.")]
    peft = [f"--policy.path={base}", "--peft.method_type=LORA", "--peft.r=4", "--steps=2", "--save_freq=2"]
    ok(train(*args, *peft, f"--output_dir={run}"))
    return step_dir(run, 2)


def test_peft_plan_counts_the_sharded_frozen_base(peft_checkpoint: Path, tmp_path: Path) -> None:
    flags = {"nproc": 2, "dp_shard": 2}
    assert verify_resume(peft_checkpoint, TargetRequest(**flags)).resumable
    plan = plan_reshard(peft_checkpoint, TargetRequest(**flags))
    assert plan.workable and plan.target.layout == "fsdp"
    assert all(r.resident_complete for r in plan.ranks)
    base = json.loads((peft_checkpoint / "pretrained_model/train_config.json").read_text())["policy"]["path"]
    assert any(r.role == "base" and r.path == f"{base}/model.safetensors" for r in plan.ranks[0].reads)
    # The adapter is a small part of what a rank holds: the frozen base dominates.
    assert plan.ranks[0].resident.grads * 5 < plan.ranks[0].resident.params
    out = tmp_path / "fsdp"
    ok(train(*resume_args(peft_checkpoint, out, "--parallelism.dp_shard=2", "--steps=3"), nproc=2))
    assert_plan_is_true(plan, out)


def test_peft_base_moved_away_is_not_resumable(peft_checkpoint: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt" / peft_checkpoint.name
    shutil.copytree(peft_checkpoint, ckpt)
    gone = str(tmp_path / "moved" / "pretrained_model")
    for name, keys in (
        ("train_config.json", ("policy", "path")),
        ("adapter_config.json", ("base_model_name_or_path",)),
    ):
        path = ckpt / "pretrained_model" / name
        doc = json.loads(path.read_text())
        (doc[keys[0]] if len(keys) == 2 else doc)[keys[-1]] = gone
        path.write_text(json.dumps(doc))
    report = verify_resume(ckpt)
    assert not report.resumable
    assert [c.name for c in report.failures] == ["peft-base"]
    assert gone in report.failures[0].message and "no such directory" in report.failures[0].message
    assert {c.name: c.status for c in report.checks}["adapter-config"] == "warn"
    proc = train(*resume_args(ckpt, tmp_path / "out"))
    assert proc.returncode != 0 and gone in proc.stderr
