"""verify-resume on broken variants of real checkpoints: "not resumable", with the right reason.

Every variant is a copy of a step directory the training core wrote, then damaged the way
real accidents damage checkpoints: a deleted or truncated file, an edited config, metadata
that lost a tensor. For some variants the training core's own resume is run too, to show the
verdict matches what really happens.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from ckpt_tools.resume.plan import plan_reshard
from ckpt_tools.resume.target import TargetRequest
from ckpt_tools.resume.verify import VerifyReport, verify_resume
from devtools.training import LEGACY_CHECKPOINT, TINY, ok, step_dir, train
from tests.support.save_record import without_save_record

MODEL_DCP = "pretrained_model/pytorch_model_fsdp_0"
OPTIM_DCP = "training_state/optimizer_0"
ONE_PROCESS = ["--parallelism.dp_shard=1", "--checkpoint_format=safetensors"]


def variant(src: Path, tmp_path: Path, damage: Callable[[Path], object]) -> Path:
    dst = tmp_path / "checkpoints" / src.name
    shutil.copytree(src, dst)
    damage(dst)
    return dst


def failed(report: VerifyReport) -> dict[str, str]:
    return {c.name: c.message for c in report.failures}


def statuses(report: VerifyReport) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


def truncate(path: Path, drop: int = 100) -> None:
    os.truncate(path, path.stat().st_size - drop)


def edit_json(path: Path, **changes: object) -> None:
    doc = json.loads(path.read_text())
    for dotted, value in changes.items():
        node = doc
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    path.write_text(json.dumps(doc))


def resume(ckpt: Path, out: Path, *extra: str) -> object:
    return train("--resume=true", f"--config_path={ckpt}", f"--output_dir={out}", *extra)


@pytest.fixture
def fsdp(runs: dict[str, Path], tmp_path: Path) -> Path:
    """Step 4 of the FSDP(2) safetensors_dcp run, alone in a copy of the run.

    In the run itself a resume of step 4 is refused (step 8 is there to be overwritten: the
    ``output`` check); the checks these tests are about are the same either way.
    """
    dst = tmp_path / "fsdp-run" / "checkpoints" / "000004"
    shutil.copytree(step_dir(runs["fsdp"], 4), dst)
    return dst


def test_intact_checkpoints_are_resumable(runs: dict[str, Path]) -> None:
    for name in ("ddp", "fsdp", "hsdp"):
        report = verify_resume(runs[name] / "checkpoints")  # the root: its `last`
        assert report.resumable, (name, failed(report))
        assert report.step == 8
        assert all(c.status == "pass" for c in report.checks), [c for c in report.checks if c.status != "pass"]


def test_optimizer_metadata_deleted(fsdp: Path, tmp_path: Path) -> None:
    ckpt = variant(fsdp, tmp_path, lambda d: (d / OPTIM_DCP / ".metadata").unlink())
    report = verify_resume(ckpt, TargetRequest(nproc=1, dp_shard=1, checkpoint_format="safetensors"))
    # The resumability rule asks the manifest which optimizer input the loader would read: a
    # sharded step whose optimizer DCP save never completed holds none, so it is not resumable.
    assert list(failed(report)) == ["layout"]
    assert "optimizer_0: no .metadata" in failed(report)["layout"]
    proc = resume(ckpt, tmp_path / "out", *ONE_PROCESS)  # the training core agrees
    assert proc.returncode != 0 and "optimizer_0" in proc.stderr


def test_truncated_shard_files(fsdp: Path, tmp_path: Path) -> None:
    model = variant(fsdp, tmp_path / "m", lambda d: truncate(d / MODEL_DCP / "__1_0.distcp"))
    assert list(failed(verify_resume(model))) == ["weights", "save-files"]  # also: not the size the save wrote
    assert "truncated" in failed(verify_resume(model))["weights"]
    optim = variant(fsdp, tmp_path / "o", lambda d: truncate(d / OPTIM_DCP / "__0_0.distcp", 1))
    assert list(failed(verify_resume(optim))) == ["optimizer", "save-files"]
    assert "__0_0.distcp" in failed(verify_resume(optim))["optimizer"]


def _zero_chunk_tail(directory: Path) -> None:
    """Overwrite the end of one chunk's archive in place: every file keeps its size."""
    from ckpt_tools.dcp.index import ChunkIndex

    chunk = next(e for e in ChunkIndex.load(directory).tensors.values() if e.shape).chunks[0]
    with open(directory / chunk.file, "r+b") as f:
        f.seek(chunk.offset + chunk.length - 64)
        f.write(bytes(64))


def test_overwritten_chunk_archive(fsdp: Path, tmp_path: Path) -> None:
    ckpt = variant(fsdp, tmp_path, lambda d: _zero_chunk_tail(d / OPTIM_DCP))
    message = failed(verify_resume(ckpt))["optimizer"]
    assert "no zip end record" in message and "optimizer.state." in message


def test_truncated_gathered_weights_of_a_ddp_run(runs: dict[str, Path], tmp_path: Path) -> None:
    ckpt = variant(step_dir(runs["ddp"], 4), tmp_path, lambda d: truncate(d / "pretrained_model/model.safetensors"))
    assert list(failed(verify_resume(ckpt))) == ["weights", "save-files"]


def test_incomplete_dcp_weights_fall_back_to_the_gathered_file(fsdp: Path, tmp_path: Path) -> None:
    """safetensors_dcp without the model .metadata: the loader uses model.safetensors - a warning only."""
    ckpt = variant(fsdp, tmp_path, lambda d: (d / MODEL_DCP / ".metadata").unlink())
    report = verify_resume(ckpt)
    assert report.resumable and statuses(report)["weights-dcp"] == "warn"
    assert not verify_resume(ckpt, strict=True).resumable


def test_dcp_only_weights_without_metadata_have_nothing_to_load(runs: dict[str, Path], tmp_path: Path) -> None:
    ckpt = variant(step_dir(runs["hsdp"], 4), tmp_path, lambda d: (d / MODEL_DCP / ".metadata").unlink())
    message = failed(verify_resume(ckpt))["weights"]
    assert "neither pytorch_model_fsdp_0/ nor model.safetensors" in message and "did not complete" in message


def _drop_from_metadata(directory: Path, predicate: Callable[[str], bool]) -> str:
    """Remove the first tensor matching ``predicate`` from a DCP .metadata (as a lost write would)."""
    path = directory / ".metadata"
    meta = pickle.loads(path.read_bytes())  # our own training run's file
    fqn = next(k for k in meta.state_dict_metadata if predicate(k))
    del meta.state_dict_metadata[fqn]
    meta.storage_data = {k: v for k, v in meta.storage_data.items() if k.fqn != fqn}
    path.write_bytes(pickle.dumps(meta))
    return fqn


def test_metadata_that_does_not_cover_the_model(fsdp: Path, tmp_path: Path) -> None:
    lost: dict[str, str] = {}
    model = variant(fsdp, tmp_path / "m", lambda d: lost.update(m=_drop_from_metadata(d / MODEL_DCP, str)))
    message = failed(verify_resume(model))["weights-coverage"]
    assert lost["m"].removeprefix("model.") in message and "strict DCP load will fail" in message
    without_save_record(model)  # as another producer's checkpoint: the load itself must refuse it
    optim = variant(
        fsdp, tmp_path / "o", lambda d: _drop_from_metadata(d / OPTIM_DCP, lambda k: k.endswith(".exp_avg_sq"))
    )
    assert "lacks exp_avg_sq" in failed(verify_resume(optim))["optimizer-coverage"]
    proc = resume(model, tmp_path / "out", *ONE_PROCESS)  # the load refuses it, before torch's load does
    assert proc.returncode == 3 and "its weights do not fit the model: the model the config builds has 1 tensor" in (
        proc.stderr
    ), proc.stderr


def test_legacy_layout() -> None:
    report = verify_resume(LEGACY_CHECKPOINT)
    assert list(failed(report)) == ["layout"]
    assert "0.6.x" in failed(report)["layout"] and "--policy.path=" in failed(report)["layout"]


def test_sharded_run_without_optimizer_dir_is_refused_as_incomplete(fsdp: Path, tmp_path: Path) -> None:
    ckpt = variant(fsdp, tmp_path, lambda d: shutil.rmtree(d / OPTIM_DCP))
    reason = failed(verify_resume(ckpt))["layout"]
    assert "optimizer_0: missing" in reason and "holds no optimizer state" in reason and "0.6.x" not in reason


def test_a_record_of_another_step_fails_even_the_strict_gate(runs: dict[str, Path], tmp_path: Path) -> None:
    """``"step": 0`` in a later step's dir: every file is there and readable, the parts are not from one step."""
    ckpt = variant(
        step_dir(runs["ddp"], 8), tmp_path, lambda d: edit_json(d / "training_state/training_step.json", step=0)
    )
    report = verify_resume(ckpt, strict=True)
    # The edit is also not what the save wrote, and a resume of "step 0" would overwrite 000008.
    assert list(failed(report)) == ["consistency", "save-files", "output"]
    assert failed(report)["consistency"].startswith(f"{ckpt}/training_state/training_step.json: step 0, in step")
    assert [c.name for c in plan_reshard(ckpt).blockers] == ["consistency", "save-files", "output"]
    without_save_record(ckpt)  # another producer's checkpoint: the counters alone still refuse it
    assert "consistency" in failed(verify_resume(ckpt, strict=True))


def test_an_optimizer_of_another_step_is_not_resumable(runs: dict[str, Path], tmp_path: Path) -> None:
    def earlier_optimizer(d: Path) -> None:
        shutil.rmtree(d / OPTIM_DCP)
        shutil.copytree(step_dir(runs["fsdp"], 4) / OPTIM_DCP, d / OPTIM_DCP)

    report = verify_resume(variant(step_dir(runs["fsdp"], 8), tmp_path, earlier_optimizer), strict=True)
    # Its param groups hold step 4's scheduled lr too: not the scheduler state's.
    assert list(failed(report)) == ["consistency", "hyperparameters", "save-files"]
    assert "optimizer_0: Adam step 4 (" in failed(report)["consistency"]


def test_train_config_that_disagrees_with_the_record(fsdp: Path, tmp_path: Path) -> None:
    config = "pretrained_model/train_config.json"
    shards = variant(fsdp, tmp_path / "p", lambda d: edit_json(d / config, parallelism__dp_shard=4))
    report = verify_resume(shards)
    assert list(failed(report)) == ["topology"] and "1×4 = 4 ≠ world size 2" in failed(report)["topology"]
    assert "parallelism 1×4 (config) vs 1×2" in {c.name: c.message for c in report.checks}["config-vs-record"]
    batch = variant(fsdp, tmp_path / "b", lambda d: edit_json(d / config, batch_size=4))
    report = verify_resume(batch)
    assert report.resumable  # the training core resumes it, with train_config.json's batch size ...
    assert statuses(report)["config-vs-record"] == statuses(report)["data-order"] == "warn"
    assert "batch_size 4 (config) vs 8 (record)" in {c.name: c.message for c in report.checks}["config-vs-record"]
    # The edit of train_config.json changes the run (config-edits), as the disagreement with the record says.
    assert set(failed(verify_resume(batch, strict=True))) == {
        "config-vs-record",
        "config-edits",
        "data-order",
        "effective-batch",
    }


def test_dataset_gone(fsdp: Path, tmp_path: Path) -> None:
    gone = str(tmp_path / "no-dataset")
    ckpt = variant(fsdp, tmp_path, lambda d: edit_json(d / "pretrained_model/train_config.json", dataset__root=gone))
    assert gone in failed(verify_resume(ckpt))["dataset"]


def test_target_topology_and_flags(fsdp: Path) -> None:
    refused = verify_resume(fsdp, TargetRequest(nproc=1))  # the saved config says dp_shard=2
    assert list(failed(refused)) == ["topology"] and "--dp-shard 1" in failed(refused)["topology"]
    dcp_on_one = verify_resume(fsdp, TargetRequest(nproc=1, dp_shard=1))  # safetensors_dcp needs a sharded run
    assert (
        list(failed(dcp_on_one)) == ["start-up"] and "--checkpoint_format=safetensors" in failed(dcp_on_one)["start-up"]
    )
    accum = verify_resume(fsdp, TargetRequest(grad_accum=3))  # save_freq=4 is not a multiple of 3
    assert "--save_freq=4" in failed(accum)["start-up"]
    hsdp = verify_resume(fsdp, TargetRequest(dp_replicate=2, dp_shard=2))  # nproc implied: 4
    assert hsdp.resumable and hsdp.target.startswith("HSDP over 2×2")


@pytest.fixture(scope="module")
def fp16_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("fp16") / "run"
    ok(train(*TINY, "--steps=2", "--save_freq=2", "--accelerator.mixed_precision=fp16", f"--output_dir={run}"))
    return step_dir(run, 2)


def test_fp16_scaler_state(fp16_checkpoint: Path, fsdp: Path, tmp_path: Path) -> None:
    assert verify_resume(fp16_checkpoint).resumable
    changed = verify_resume(fp16_checkpoint, TargetRequest(mixed_precision="bf16"))
    assert changed.resumable and statuses(changed)["precision"] == "warn"
    assert list(failed(verify_resume(fp16_checkpoint, TargetRequest(mixed_precision="bf16"), strict=True))) == [
        "precision"
    ]
    upgraded = verify_resume(fsdp, TargetRequest(mixed_precision="fp16"))  # an fp32 checkpoint has no scaler state
    assert "saved with mixed precision no" in failed(upgraded)["scaler"]
    ckpt = variant(fp16_checkpoint, tmp_path, lambda d: (d / "training_state/scaler_state.json").unlink())
    assert list(failed(verify_resume(ckpt))) == ["scaler"]
    proc = resume(ckpt, tmp_path / "out")  # the training core agrees
    assert proc.returncode != 0 and "scaler_state.json" in proc.stderr


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        ({"batch_size": "eight"}, "batch_size"),
        ({"optimizer__lr": [1, 2]}, "lr"),
        ({"log_freq": 0}, "log_freq"),
    ],
    ids=["text for an int", "a list for a float", "a value out of range"],
)
def test_a_config_the_trainer_cannot_build_is_not_resumable(
    runs: dict[str, Path], tmp_path: Path, edit: dict[str, object], needle: str
) -> None:
    """verify-resume runs the trainer's own parse and validation of train_config.json: same verdict, same line."""
    ckpt = variant(
        step_dir(runs["ddp"], 8), tmp_path, lambda d: edit_json(d / "pretrained_model/train_config.json", **edit)
    )
    report = verify_resume(ckpt)
    line = failed(report).get("config-builds")
    assert not report.resumable and line is not None and needle in line, failed(report)


@pytest.mark.torchrun
def test_the_trainer_refuses_that_config_with_the_same_line(runs: dict[str, Path], tmp_path: Path) -> None:
    ckpt = variant(
        step_dir(runs["ddp"], 8),
        tmp_path,
        lambda d: edit_json(d / "pretrained_model/train_config.json", batch_size="eight"),
    )
    line = failed(verify_resume(ckpt))["config-builds"]
    proc = train("--resume=true", f"--config_path={ckpt}", "--steps=10")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert [x for x in proc.stderr.splitlines() if x.startswith("error:")] == [f"error: {line}"], proc.stderr[-2000:]
