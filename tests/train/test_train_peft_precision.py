"""PEFT (LoRA) on FSDP2/HSDP with adapter-only checkpoints (and what the tools say of them); bf16 / fp16."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ckpt_tools.resume.plan import plan_reshard
from ckpt_tools.resume.target import TargetRequest
from ckpt_tools.resume.verify import verify_resume
from devtools.training import TINY, dcp_to_dict, losses, ok, step_dir, train, unstamped_json
from tests.support.resume_audit import assert_plan_is_true

pytestmark = pytest.mark.torchrun

BASE_FLAGS = [a for a in TINY if not a.startswith("--policy.")]
LORA = ["--peft.method_type=LORA", "--peft.r=4", "--optimizer.lr=5e-3"]


@pytest.fixture(scope="module")
def base_policy(runs: dict[str, Path]) -> Path:
    """The full policy the adapters train on: the session's DDP run's last weights (TINY's policy)."""
    return step_dir(runs["ddp"], 8) / "pretrained_model"


@pytest.fixture(scope="module")
def lora_runs(base_policy: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    runs = {"fsdp": root / "fsdp", "hsdp": root / "hsdp"}
    common = [*BASE_FLAGS, f"--policy.path={base_policy}", *LORA, "--steps=4", "--save_freq=2"]
    ok(
        train(
            *common,
            "--parallelism.dp_shard=2",
            "--checkpoint_format=safetensors_dcp",
            f"--output_dir={runs['fsdp']}",
            nproc=2,
        )
    )
    ok(
        train(
            *common,
            "--batch_size=4",
            "--parallelism.dp_replicate=2",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=dcp",
            f"--output_dir={runs['hsdp']}",
            nproc=4,
        )
    )
    return runs


def test_lora_checkpoints_hold_only_the_adapter(lora_runs: dict[str, Path], base_policy: Path, tmp_path: Path) -> None:
    for name, run in lora_runs.items():
        pm = step_dir(run, 4) / "pretrained_model"
        assert not (pm / "model.safetensors").exists(), name
        config = json.loads((pm / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(base_policy)
        shards = dcp_to_dict(pm / "pytorch_model_fsdp_0", tmp_path)["model"]
        assert shards and all("lora_" in k for k in shards), name
        optimizer = dcp_to_dict(step_dir(run, 4) / "training_state/optimizer_0", tmp_path)["optimizer"]["state"]
        assert set(optimizer) == set(shards), name  # only adapter parameters are trained
    with safe_open(str(step_dir(lora_runs["fsdp"], 4) / "pretrained_model/adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and all(".lora_A.weight" in k or ".lora_B.weight" in k for k in keys)
    assert not (step_dir(lora_runs["hsdp"], 4) / "pretrained_model/adapter_model.safetensors").exists()
    adapter = load_file(str(step_dir(lora_runs["fsdp"], 4) / "pretrained_model/adapter_model.safetensors"))
    assert all(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # zero-initialised, then trained


def test_lora_resume_is_bit_exact_and_base_stays_sharded(
    lora_runs: dict[str, Path], base_policy: Path, tmp_path: Path
) -> None:
    src = lora_runs["fsdp"]
    out = tmp_path / "resumed"
    (out / "checkpoints").mkdir(parents=True)
    ckpt = out / "checkpoints" / "000002"
    shutil.copytree(step_dir(src, 2), ckpt)
    # reshard-plan counts the frozen base the resume rebuilds from policy.path, read from its own header.
    target = TargetRequest(nproc=2, dp_shard=2)
    assert verify_resume(ckpt, target).resumable
    plan = plan_reshard(ckpt, target)
    assert plan.workable and plan.target.layout == "fsdp" and all(r.resident_complete for r in plan.ranks)
    assert any(r.role == "base" and r.path == f"{base_policy}/model.safetensors" for r in plan.ranks[0].reads)
    assert plan.ranks[0].resident.grads * 5 < plan.ranks[0].resident.params  # the frozen base dominates
    ok(train("--resume=true", f"--config_path={ckpt}", f"--output_dir={out}", nproc=2))
    assert_plan_is_true(plan, out)
    name = "pretrained_model/adapter_model.safetensors"
    a, b = load_file(str(step_dir(out, 4) / name)), load_file(str(step_dir(src, 4) / name))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # Each rank holds its half of the frozen base (plus its half of the adapter), never all of it.
    audits = [json.loads((out / "resume_audit" / f"rank{r}.json").read_text()) for r in (0, 1)]
    full = sum(t.numel() * 4 for t in load_file(str(base_policy / "model.safetensors")).values())
    adapter_bytes = sum(t.numel() * 4 for t in a.values())
    assert sum(x["resident"]["params"] for x in audits) == full + adapter_bytes
    assert all(x["resident"]["params"] < 0.6 * (full + adapter_bytes) for x in audits)
    assert all(x["resident"]["grads"] < 0.6 * adapter_bytes + 4096 for x in audits)  # only adapter grads


def test_peft_base_moved_away_is_not_resumable(lora_runs: dict[str, Path], tmp_path: Path) -> None:
    """A LoRA checkpoint holds only the adapter: without its base, verify-resume fails exactly when resume does."""
    ckpt = tmp_path / "ckpt" / "000002"
    shutil.copytree(step_dir(lora_runs["fsdp"], 2), ckpt)
    gone = str(tmp_path / "moved" / "pretrained_model")
    for name, keys in (
        ("train_config.json", ("policy", "path")),
        ("adapter_config.json", ("base_model_name_or_path",)),
    ):
        path = ckpt / "pretrained_model" / name
        doc = json.loads(path.read_text())
        (doc[keys[0]] if len(keys) == 2 else doc)[keys[-1]] = gone
        path.write_text(json.dumps(doc))
    report = verify_resume(ckpt, TargetRequest(output_dir=tmp_path / "out"))  # where the resume below writes
    assert not report.resumable
    assert [c.name for c in report.failures] == ["peft-base"]
    assert gone in report.failures[0].message and "no such directory" in report.failures[0].message
    assert {c.name: c.status for c in report.checks}["adapter-config"] == "warn"
    one = ["--parallelism.dp_shard=1", "--checkpoint_format=safetensors"]  # onto one process: the cheapest launch
    proc = train("--resume=true", f"--config_path={ckpt}", *one, f"--output_dir={tmp_path / 'out'}")
    assert proc.returncode != 0 and gone in proc.stderr, proc.stderr


def test_a_peft_adapter_is_not_a_policy_path(
    lora_runs: dict[str, Path], base_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """LeRobot's "load a PEFT checkpoint with --policy.path": refused in one line naming what to pass instead.

    The adapter holds no full weights (an `optimizer got an empty parameter list` traceback
    before); the trainer refuses it before anything is built, and verify-resume fails a
    checkpoint whose policy.path names one with the same line.
    """
    from tests.support.train_cli import refused_in_process

    peft_checkpoint = step_dir(lora_runs["fsdp"], 4)
    adapter = peft_checkpoint / "pretrained_model"
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    flags = [a for a in TINY if not a.startswith("--policy.")]
    line = refused_in_process([*flags, f"--policy.path={adapter}", f"--output_dir={tmp_path / 'out'}"], capsys)
    expected = (
        f"--policy.path={adapter}: a PEFT adapter (adapter_model.safetensors), not a full policy; to train an"
        f" adapter on its base pass --policy.path={base} with --peft.method_type=LORA --peft.r=N, or continue it"
        f" with --resume=true --config_path={peft_checkpoint}"
    )
    assert line == f"error: {expected}"
    with_peft = refused_in_process(
        [*flags, f"--policy.path={adapter}", "--peft.r=4", f"--output_dir={tmp_path}"], capsys
    )
    assert with_peft == line
    assert not (tmp_path / "out").exists()
    ckpt = tmp_path / "ckpt" / base_policy.parent.name  # a full-weights run's checkpoint
    shutil.copytree(base_policy.parent, ckpt)
    config = ckpt / "pretrained_model" / "train_config.json"
    doc = json.loads(config.read_text())
    doc["policy"]["path"] = str(adapter)  # a run started from the adapter (by a version that took one)
    config.write_text(json.dumps(doc))
    failures = {c.name: c.message for c in verify_resume(ckpt).failures}
    assert failures == {"pretrained-policy": f"train_config.json policy.path: {expected}"}


def test_lora_resumes_onto_one_process(lora_runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "single"
    ok(
        train(
            "--resume=true",
            f"--config_path={step_dir(lora_runs['hsdp'], 4)}",
            f"--output_dir={out}",
            "--parallelism.dp_replicate=1",
            "--parallelism.dp_shard=1",
            "--checkpoint_format=safetensors",
        )
    )
    restored = load_file(str(step_dir(out, 4) / "pretrained_model/adapter_model.safetensors"))
    shards = dcp_to_dict(step_dir(lora_runs["hsdp"], 4) / "pretrained_model/pytorch_model_fsdp_0", tmp_path)["model"]
    assert {k.replace(".default.", "."): v for k, v in shards.items()}.keys() == restored.keys()
    assert all(torch.equal(v, restored[k.replace(".default.", ".")]) for k, v in shards.items())


def test_converted_adapter_loads_with_peft_and_reproduces_outputs(
    lora_runs: dict[str, Path], base_policy: Path, tmp_path: Path
) -> None:
    from peft import PeftModel

    from ckpt_tools.convert import convert_dcp
    from ckpt_tools.train.policies.registry import policy_from_pretrained

    pm = step_dir(lora_runs["fsdp"], 4) / "pretrained_model"
    converted = tmp_path / "converted"
    converted.mkdir()
    shutil.copy(pm / "adapter_config.json", converted)
    convert_dcp(pm, output=converted, progress=False)
    batch = {"observation.state": torch.randn(3, 14, generator=torch.Generator().manual_seed(0))}

    def outputs(adapter_dir: Path | None) -> torch.Tensor:
        policy = policy_from_pretrained(base_policy).eval()
        model = PeftModel.from_pretrained(policy, str(adapter_dir)).eval() if adapter_dir else policy
        with torch.no_grad():
            return (
                model.base_model.model.predict_action_chunk(batch)
                if adapter_dir
                else policy.predict_action_chunk(batch)
            )

    trained, from_converted = outputs(pm), outputs(converted)
    assert torch.equal(trained, from_converted)
    assert not torch.equal(trained, outputs(None))
    # A dcp-only PEFT checkpoint is not a --policy.path until converted.
    dcp_only = step_dir(lora_runs["hsdp"], 4) / "pretrained_model"
    proc = train(*BASE_FLAGS, f"--policy.path={dcp_only}", "--steps=1", f"--output_dir={tmp_path / 'x'}")
    assert proc.returncode == 2 and "run `ckpt-tools convert-dcp --checkpoint-dir" in proc.stderr


def test_lora_target_module_not_found(base_policy: Path, tmp_path: Path) -> None:
    proc = train(
        *BASE_FLAGS,
        f"--policy.path={base_policy}",
        *LORA,
        '--peft.target_modules=["q_proj"]',
        f"--output_dir={tmp_path}",
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1
    assert "--peft.target_modules: ['q_proj'] not found among the policy's linear layers" in lines[0]


def test_bf16_trains_and_checkpoints_fp32(tmp_path: Path) -> None:
    out = tmp_path / "bf16"
    proc = ok(
        train(
            *TINY,
            "--steps=10",
            "--save_freq=10",
            "--parallelism.dp_shard=2",
            "--accelerator.mixed_precision=bf16",
            f"--output_dir={out}",
            nproc=2,
        )
    )
    assert "MixedPrecisionPolicy(param=bfloat16, reduce=bfloat16" in proc.stdout
    values = losses(out)
    assert sum(values[-3:]) < sum(values[:3])
    assert all(
        t.dtype == torch.float32
        for t in load_file(str(step_dir(out, 10) / "pretrained_model/model.safetensors")).values()
    )
    record = json.loads((step_dir(out, 10) / "training_state/training_step.json").read_text())
    assert record["mixed_precision_policy"] == {
        "param_dtype": "bfloat16",
        "reduce_dtype": "bfloat16",
        "output_dtype": None,
        "cast_forward_inputs": True,
    }
    assert not (step_dir(out, 10) / "training_state/scaler_state.json").exists()


def test_fp16_sharded_scaler_state_is_saved_and_restored(tmp_path: Path) -> None:
    # FSDP over 2 processes: the scaler's overflow check is agreed across ranks as under HSDP
    # (the same all-reduce over every rank), at half the process starts of a 2×2 mesh.
    out = tmp_path / "fp16"
    common = ["--parallelism.dp_shard=2", "--checkpoint_format=dcp", "--accelerator.mixed_precision=fp16"]
    ok(train(*TINY, *common, "--steps=16", "--save_freq=8", f"--output_dir={out}", nproc=2))
    values = losses(out)
    assert sum(values[-4:]) < sum(values[:4])
    scaler = unstamped_json(step_dir(out, 16) / "training_state/scaler_state.json")  # its save's id aside
    assert scaler["scale"] < 65536.0  # the scaler backed off on overflowing steps, identically on every rank
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(step_dir(out, 8), resumed / "checkpoints" / "000008")
    ok(train("--resume=true", f"--config_path={resumed / 'checkpoints/000008'}", f"--output_dir={resumed}", nproc=2))
    assert unstamped_json(step_dir(resumed, 16) / "training_state/scaler_state.json") == scaler
    a = dcp_to_dict(step_dir(resumed, 16) / "pretrained_model/pytorch_model_fsdp_0", tmp_path)["model"]
    b = dcp_to_dict(step_dir(out, 16) / "pretrained_model/pytorch_model_fsdp_0", tmp_path)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ignored_modules_match_peft_module_names(base_policy: Path, tmp_path: Path) -> None:
    out = tmp_path / "ignored"
    common = [
        *BASE_FLAGS,
        f"--policy.path={base_policy}",
        *LORA,
        "--steps=2",
        "--save_freq=2",
        "--parallelism.dp_shard=2",
    ]
    ignored = ["--accelerator.fsdp.ignored_modules=.*action_head", "--accelerator.mixed_precision=bf16"]
    proc = ok(train(*common, *ignored, f"--output_dir={out}", nproc=2))  # bf16: the ignored head gets bf16 input
    assert "unsharded (ignored_modules): base_model.model.action_head (computed in float32" in proc.stdout
    # A pattern that matches no whole path is refused: tests/train/test_ignored_modules.py, in-process.
