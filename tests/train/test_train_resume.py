"""Resume: bit-exact on the same topology, resharding onto others (as reshard-plan predicts), data order, 0.6.x refusal."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from ckpt_tools.resume.plan import plan_reshard
from ckpt_tools.resume.target import TargetRequest
from ckpt_tools.resume.verify import verify_resume
from devtools.training import (
    LEGACY_CHECKPOINT,
    TINY,
    assert_tensors_equal,
    dcp_optimizer_by_name,
    dcp_to_dict,
    flat_optimizer_by_name,
    gathered_weights,
    ok,
    sample_log,
    step_dir,
    train,
)
from tests.support.resume_audit import assert_plan_is_true

NOT_EXACT = "warning: data order is not sample-exact"

pytestmark = pytest.mark.torchrun  # every test here starts ckpt-train


def copy_checkpoint(src_run: Path, step: int, dst_run: Path) -> Path:
    """A fresh output dir holding only one checkpoint: what a crash after that save leaves."""
    (dst_run / "checkpoints").mkdir(parents=True)
    dst = dst_run / "checkpoints" / f"{step:06d}"
    shutil.copytree(step_dir(src_run, step), dst)
    return dst


def resume_args(checkpoint: Path, output_dir: Path, *extra: str) -> list[str]:
    return [
        "--resume=true",
        f"--config_path={checkpoint}/pretrained_model/train_config.json",
        f"--output_dir={output_dir}",
        *extra,
    ]


def flat_optimizer(step: Path) -> dict[str, torch.Tensor]:
    return flat_optimizer_by_name(step)


def dcp_optimizer(step: Path, tmp: Path) -> dict[str, torch.Tensor]:
    return dcp_optimizer_by_name(step / "training_state/optimizer_0", tmp)


def dcp_model(step: Path, tmp: Path) -> dict[str, torch.Tensor]:
    return dcp_to_dict(step / "pretrained_model/pytorch_model_fsdp_0", tmp)["model"]


def test_fsdp_resume_on_same_topology_is_bit_exact(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "resumed"
    ckpt = copy_checkpoint(runs["fsdp"], 4, out)
    proc = ok(train(*resume_args(ckpt, out), nproc=2))
    assert NOT_EXACT not in proc.stdout
    assert_tensors_equal(gathered_weights(out, 8), gathered_weights(runs["fsdp"], 8))
    assert_tensors_equal(dcp_optimizer(step_dir(out, 8), tmp_path), dcp_optimizer(step_dir(runs["fsdp"], 8), tmp_path))
    # Same samples on the same ranks in the same order as the uninterrupted run.
    assert sample_log(out) == {
        r: {s: v for s, v in steps.items() if s > 4} for r, steps in sample_log(runs["fsdp"]).items()
    }


def test_single_process_resume_with_grad_accumulation_is_bit_exact(tmp_path: Path) -> None:
    args = [*TINY, "--steps=8", "--save_freq=4", "--accelerator.gradient_accumulation.steps=2"]
    full = tmp_path / "full"
    proc = ok(train(*args, f"--output_dir={full}"))
    assert "lr_scheduler.step()" not in proc.stderr  # the schedule runs per loop step by design: no torch warning
    out = tmp_path / "resumed"
    ckpt = copy_checkpoint(full, 4, out)
    resumed = ok(train(*resume_args(ckpt, out)))
    assert "; 8 steps = 4 optimizer updates," in proc.stdout
    # The banner of a resume counts what this launch still does, beside the run's total.
    assert "resuming after step 4: 4 of 8 steps left = 2 optimizer updates," in resumed.stdout, resumed.stdout
    assert_tensors_equal(gathered_weights(out, 8), gathered_weights(full, 8))
    assert_tensors_equal(flat_optimizer(step_dir(out, 8)), flat_optimizer(step_dir(full, 8)))
    record = (step_dir(full, 8) / "training_state/training_step.json").read_text()
    assert '"optimizer_steps": 4' in record and '"grad_accum_steps": 2' in record


def test_fsdp_checkpoint_reshards_onto_one_process(runs: dict[str, Path], tmp_path: Path) -> None:
    """Also without its RNG state: that is read only on an unchanged world size, so 2 → 1 still resumes."""
    src_run = tmp_path / "fsdp-run"
    src = copy_checkpoint(runs["fsdp"], 4, src_run)
    (src / "training_state/rng_state.safetensors").unlink()
    same = verify_resume(src)
    assert not same.resumable and [c.name for c in same.failures] == ["rng-state"]
    target = TargetRequest(nproc=1, dp_shard=1, checkpoint_format="safetensors")
    assert verify_resume(src, target).resumable
    plan = plan_reshard(src, target)
    assert plan.workable and plan.target.layout == "single"
    assert [r.dcp_reads() for r in plan.ranks] == [
        {  # one process reads every saved span of both DCP directories, whole files
            f"{d}/{f.name}": f.stat().st_size
            for d in ("pretrained_model/pytorch_model_fsdp_0", "training_state/optimizer_0")
            for f in sorted((src / d).glob("*.distcp"))
        }
    ]
    out = tmp_path / "single"
    proc = ok(train(*resume_args(src, out, "--parallelism.dp_shard=1", "--checkpoint_format=safetensors", "--steps=4")))
    assert NOT_EXACT in proc.stdout
    # Not the run the checkpoint is in: said at start-up, before anything is written.
    assert f"warning: resuming step 000004 of run {src_run.resolve()} into --output_dir={out}:" in proc.stdout
    assert_plan_is_true(plan, out)
    restored = step_dir(out, 4)
    assert_tensors_equal(gathered_weights(out, 4), gathered_weights(runs["fsdp"], 4))
    assert_tensors_equal(flat_optimizer(restored), dcp_optimizer(src, tmp_path))
    assert (restored / "training_state/training_step.json").read_text().count('"world_size": 1') == 1


def test_fsdp_checkpoint_reshards_onto_hsdp(runs: dict[str, Path], tmp_path: Path) -> None:
    src = step_dir(runs["fsdp"], 4)
    out = tmp_path / "hsdp"
    target = TargetRequest(nproc=4, dp_replicate=2, dp_shard=2, checkpoint_format="dcp", output_dir=out)
    assert verify_resume(src, target).resumable
    plan = plan_reshard(src, target)
    assert plan.workable and plan.target.layout == "hsdp"
    # Replicas of a shard read the same spans; the two shards split the saved chunks between them.
    assert plan.ranks[0].dcp_reads().keys() == plan.ranks[2].dcp_reads().keys()
    assert plan.ranks[0].resident == plan.ranks[2].resident
    args = resume_args(
        src, out, "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--checkpoint_format=dcp", "--steps=4"
    )
    proc = ok(train(*args, nproc=4))
    assert NOT_EXACT in proc.stdout
    assert_plan_is_true(plan, out)
    assert_tensors_equal(dcp_model(step_dir(out, 4), tmp_path), gathered_weights(runs["fsdp"], 4))
    assert_tensors_equal(dcp_optimizer(step_dir(out, 4), tmp_path), dcp_optimizer(src, tmp_path))


def test_hsdp_checkpoint_reshards_onto_fsdp(runs: dict[str, Path], tmp_path: Path) -> None:
    src = step_dir(runs["hsdp"], 4)
    out = tmp_path / "fsdp"
    args = resume_args(
        src,
        out,
        "--parallelism.dp_replicate=1",
        "--parallelism.dp_shard=2",
        "--checkpoint_format=safetensors_dcp",
        "--steps=4",
    )
    target = TargetRequest(nproc=2, dp_replicate=1, dp_shard=2, checkpoint_format="safetensors_dcp", output_dir=out)
    assert verify_resume(src, target).resumable
    plan = plan_reshard(src, target)
    assert plan.workable and not plan.data.sample_exact
    proc = ok(train(*args, nproc=2))
    assert NOT_EXACT in proc.stdout  # world 4 × batch 4 → world 2 × batch 4
    assert_plan_is_true(plan, out)
    assert_tensors_equal(gathered_weights(out, 4), dcp_model(src, tmp_path))
    assert_tensors_equal(dcp_optimizer(step_dir(out, 4), tmp_path), dcp_optimizer(src, tmp_path))


def test_resume_on_another_world_size_skips_and_repeats_no_sample(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "continued"
    proc = ok(
        train(
            *resume_args(
                step_dir(runs["fsdp"], 4),
                out,
                "--parallelism.dp_shard=1",
                "--checkpoint_format=safetensors",
                "--log_samples=true",
            )
        )
    )
    assert NOT_EXACT in proc.stdout
    before = sample_log(runs["fsdp"])
    seen = [i for step in range(1, 5) for rank in (0, 1) for i in before[rank][step]]
    seen += [i for step in range(5, 9) for i in sample_log(out)[0][step]]
    assert len(seen) == 2 * 4 * 8 + 4 * 8
    assert len(set(seen)) == len(seen), "a sample was repeated across the resume boundary"
    # Nothing skipped: exactly the first 96 samples of the global order the uninterrupted run used.
    uninterrupted = [i for step in range(1, 7) for rank in (0, 1) for i in before[rank][step]]
    assert set(seen) == set(uninterrupted)


def test_legacy_checkpoint_is_refused_plainly_but_loads_as_pretrained(tmp_path: Path) -> None:
    proc = train(*resume_args(LEGACY_CHECKPOINT, tmp_path / "x"))
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "0.6.x" in lines[0] and "cannot be resumed" in lines[0] and "--policy.path=" in lines[0]
    out = tmp_path / "finetune"
    ok(
        train(
            *[a for a in TINY if not a.startswith("--policy.")],
            f"--policy.path={LEGACY_CHECKPOINT}/pretrained_model",
            "--steps=2",
            "--save_freq=2",
            f"--output_dir={out}",
        )
    )
    cfg = (step_dir(out, 2) / "pretrained_model/train_config.json").read_text()
    assert str(LEGACY_CHECKPOINT / "pretrained_model") in cfg
