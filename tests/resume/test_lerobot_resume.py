"""``verify-resume`` / ``reshard-plan`` on checkpoints LeRobot wrote: LeRobot's resume predicted, ckpt-train's refusal matched.

What LeRobot main's ``lerobot-train --resume=true`` does with each (read from its source and seen
by running it on copies of these fixtures) is in docs/resume.md, "Checkpoints LeRobot wrote".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_tools.errors import CkptError
from ckpt_tools.format.layout import StepPaths, resolve_step
from ckpt_tools.resume.plan import plan_reshard
from ckpt_tools.resume.target import TargetRequest
from ckpt_tools.resume.verify import verify_resume
from ckpt_tools.train.checkpoint.parts import load_training_step
from tests.support.cli import invoke_cli
from tests.support.lerobot_fixtures import MAIN_RUNS, all_runs, main_run, run_id, v061_run


def failed(report) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {c.name: c.message for c in report.checks if c.status == "fail"}


@pytest.mark.parametrize("name", MAIN_RUNS)
def test_lerobot_main_checkpoints_resume_on_their_topology(name: str) -> None:
    report = verify_resume(main_run(name) / "checkpoints")
    assert report.resumable, failed(report)
    assert report.trainer == "lerobot-train"
    checks = {c.name: c.message for c in report.checks}
    assert "LeRobot main's rules" in checks["trainer"]
    assert "LeRobot's rule" in checks["training-step"]
    assert (
        "sample-exact" in checks["data-order"]
        and "LeRobot's sampler resumes at epoch 0, sample" in checks["data-order"]
    )


@pytest.mark.parametrize(
    "name, request_, target",
    [
        ("fsdp-dcp", TargetRequest(nproc=4, dp_shard=4), "FSDP over 4 shards"),
        ("fsdp-dcp", TargetRequest(nproc=4, dp_replicate=2, dp_shard=2), "HSDP over 2×2 (dp_replicate×dp_shard)"),
        ("hsdp-dcp", TargetRequest(nproc=2, dp_replicate=1, dp_shard=2), "FSDP over 2 shards"),
        ("ddp", TargetRequest(nproc=1, dp_replicate=1), "SINGLE over 1 process"),
        ("single", TargetRequest(nproc=4), "DDP over 4 processes"),
    ],
)
def test_lerobot_main_checkpoints_reshard_within_their_kind(name: str, request_: TargetRequest, target: str) -> None:
    report = verify_resume(main_run(name), request_)
    assert report.resumable, failed(report)
    assert report.target == target
    plan = plan_reshard(main_run(name), request_)
    assert plan.workable and plan.trainer == "lerobot-train"
    assert len(plan.ranks) == request_.nproc
    # Every rank loads LeRobot's one RNG state, whatever the world size.
    assert all(any(r.path == "training_state/rng_state.safetensors" for r in rank.reads) for rank in plan.ranks)


def test_lerobot_refuses_to_cross_the_sharded_boundary() -> None:
    report = verify_resume(
        main_run("fsdp-safetensors_dcp"), TargetRequest(nproc=1, dp_shard=1, checkpoint_format="safetensors")
    )
    # LeRobot main's own line (seen running it): "Cannot resume: the checkpoint was written with a sharded
    # topology (dp_replicate=1, dp_shard=2) but this run is non-sharded (dp_replicate=1, dp_shard=1)."
    assert "Cannot resume: the checkpoint was written with a sharded topology" in failed(report)["topology"]
    plan = plan_reshard(
        main_run("fsdp-safetensors_dcp"), TargetRequest(nproc=1, dp_shard=1, checkpoint_format="safetensors")
    )
    assert not plan.workable and [c.name for c in plan.blockers] == ["topology"]


def test_lerobot_0_6_single_and_ddp_resume_unsharded_in_lerobot() -> None:
    for name in ("single", "single-cosine", "ddp"):
        report = verify_resume(v061_run(name))
        assert report.resumable, (name, failed(report))
    # A sharded resume reads optimizer_0/, which a 0.6.x checkpoint does not have.
    sharded = verify_resume(v061_run("ddp"), TargetRequest(nproc=2, dp_shard=2))
    assert "optimizer_0: missing" in failed(sharded)["topology"] and "unsharded" in failed(sharded)["topology"]


def test_lerobot_0_6_fsdp_is_refused_with_its_reason() -> None:
    report = verify_resume(v061_run("fsdp"))
    assert list(failed(report)) == ["layout"]
    reason = failed(report)["layout"]
    assert "LeRobot 0.6.x FSDP checkpoint" in reason and "keyed by parameter name" in reason
    assert "only LeRobot 0.6.x" in reason and "lerobot-train --policy.path=" in reason


@pytest.mark.parametrize("run", all_runs(), ids=run_id)
def test_asked_about_ckpt_train_the_verdict_is_its_loaders(run: Path) -> None:
    report = verify_resume(run / "checkpoints", TargetRequest(trainer="ckpt-train"))
    assert not report.resumable and list(failed(report)) == ["layout"]
    with pytest.raises(CkptError) as refused:
        load_training_step(StepPaths(resolve_step(run / "checkpoints").root))
    assert failed(report)["layout"] == str(refused.value)
    assert "cannot be resumed by ckpt-train" in str(refused.value) and "lerobot-train" in str(refused.value)
    assert refused.value.exit_code == 3


def test_trainer_flag_is_checked() -> None:
    proc = invoke_cli("verify-resume", str(main_run("single")), "--trainer", "accelerate")
    assert proc.returncode == 2 and "--trainer=accelerate: choose ckpt-train or lerobot-train" in proc.stderr


def test_asked_about_lerobot_a_ckpt_train_checkpoint_is_refused() -> None:
    from devtools.training import LEGACY_CHECKPOINT

    report = verify_resume(LEGACY_CHECKPOINT, TargetRequest(trainer="lerobot-train"))
    assert list(failed(report)) == ["layout"] and "LeRobot does not build its act policy" in failed(report)["layout"]


def test_a_dataset_without_its_info_file_is_not_resumable_in_lerobot(tmp_path: Path) -> None:
    """LeRobot's dataset loader reads meta/info.json first: without it lerobot-train stops, so verify says no."""
    import shutil

    root = tmp_path / "main"
    shutil.copytree(main_run("fsdp-dcp"), root / "fsdp-dcp", symlinks=True)
    shutil.copytree(main_run("fsdp-dcp").parent / "dataset", root / "dataset")
    assert verify_resume(root / "fsdp-dcp" / "checkpoints").resumable
    (root / "dataset" / "meta" / "info.json").unlink()
    report = verify_resume(root / "fsdp-dcp" / "checkpoints")
    assert not report.resumable and "meta/info.json" in failed(report)["dataset"], failed(report)
