"""``--ema.enable=true``: LeRobot's EMA update, saved, resumed bit-exactly, converted, and the resume rule.

A 1-process and an FSDP2 (2 shards, ``dcp``) run of 4 steps with a checkpoint at 2,
each resumed from step 2 once (module-scoped, shared by every assertion; the 1-process resume saves
in the background): the resumed run's final EMA weights must equal the uninterrupted run's bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tools.format.ema import EmaSchedule
from ckpt_tools.train.ema import EmaShadow
from devtools.training import TINY, ok, step_dir, train
from tests.support.cli import invoke_cli
from tests.support.train_cli import refused_in_process

EMA = ["--ema.enable=true", "--ema.power=0.5", "--steps=4", "--save_freq=2"]


def lerobot_decay(optimization_step: int, s: EmaSchedule) -> float:
    """LeRobot's EMAConfig docstring / diffusers' ``EMAModel.get_decay`` with ``use_ema_warmup=True``, written out."""
    t = optimization_step - s.update_after_step - 1
    if t <= 0:
        return 0.0
    return max(s.min_decay, min(s.max_decay, 1 - (1 + t / s.inv_gamma) ** -s.power))


def test_update_is_lerobots_formula_on_a_toy_tensor() -> None:
    schedule = EmaSchedule(update_after_step=1, inv_gamma=2.0, power=0.6, min_decay=0.1, max_decay=0.999)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.randn(4, 3))
    model.frozen = torch.nn.Parameter(torch.randn(3), requires_grad=False)
    shadow = EmaShadow(model, schedule)
    expected_w, expected_frozen = model.w.detach().clone(), model.frozen.detach().clone()
    for n in range(1, 7):
        with torch.no_grad():
            model.w.add_(torch.randn_like(model.w))
            model.frozen.add_(1.0)
        shadow.step()
        decay = lerobot_decay(n, schedule)
        assert shadow.cur_decay_value == decay
        expected_w = expected_w - (1 - decay) * (expected_w - model.w.detach())
        expected_frozen = model.frozen.detach().clone()  # a frozen parameter is copied
        assert torch.equal(shadow.shadow["w"], expected_w)
        assert torch.equal(shadow.shadow["frozen"], expected_frozen)
    assert [schedule.decay_at(n) for n in (1, 2)] == [0.0, 0.0]  # a copy until update_after_step has passed
    assert EmaSchedule(decay=0.99).decay_at(50) == 0.99  # a constant decay pins the clamp


# layout -> (processes, flags): each trained 4 steps with EMA, then resumed from step 2. A DDP
# rank holds the whole shadow as one process does (the same code); FSDP2 shards it, and HSDP is
# FSDP2 with replicas: the same sharded shadow and DCP files (the replicas write nothing more).
EMA_LAYOUTS: dict[str, tuple[int, list[str]]] = {
    "single": (1, []),
    "fsdp": (2, ["--parallelism.dp_shard=2", "--checkpoint_format=dcp"]),
}
# The 1-process resume saves step 4 in the background: its EMA files must be the synchronous run's.
RESUME_FLAGS = {"single": ["--checkpoint_async=true"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ema")
    out = {}
    for name, (nproc, flags) in EMA_LAYOUTS.items():
        out[name] = root / name
        ok(train(*TINY, *EMA, *flags, f"--output_dir={out[name]}", nproc=nproc))
        resumed = root / f"{name}-resumed"
        again = ["--resume=true", f"--config_path={step_dir(out[name], 2)}", *RESUME_FLAGS.get(name, [])]
        ok(train(*again, f"--output_dir={resumed}", nproc=nproc))
        out[f"{name}-resumed"] = resumed
    return out


def ema_weights(run: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """The final EMA weights: the gathered file, or ``convert-dcp --ema`` of the DCP shards."""
    step = step_dir(run, 4)
    gathered = step / "pretrained_model_ema" / "model.safetensors"
    if gathered.exists():
        return load_file(gathered)
    out = tmp / f"{run.name}-ema"
    result = invoke_cli("convert-dcp", str(step), "--ema", "-o", str(out), "-q")
    assert result.returncode == 0, result.stderr
    return load_file(out / "model.safetensors")


@pytest.mark.parametrize("layout", list(EMA_LAYOUTS))
def test_resume_continues_the_ema_bit_exactly(runs: dict[str, Path], layout: str, tmp_path: Path) -> None:
    uninterrupted = ema_weights(runs[layout], tmp_path)
    resumed = ema_weights(runs[f"{layout}-resumed"], tmp_path)
    live = load_file(step_dir(runs["single"], 4) / "pretrained_model" / "model.safetensors")
    assert uninterrupted.keys() == resumed.keys() == live.keys()
    assert all(torch.equal(uninterrupted[k], resumed[k]) for k in uninterrupted)
    assert any(not torch.equal(uninterrupted[k], live[k]) for k in live)  # the shadow is not the live weights


def test_files_are_lerobots_on_one_process_and_shards_under_fsdp(runs: dict[str, Path]) -> None:
    single, fsdp = step_dir(runs["single"], 4), step_dir(runs["fsdp"], 4)
    state = torch.load(single / "training_state" / "ema_state.pt", weights_only=True)
    assert state["optimization_step"] == 4 and state["use_ema_warmup"] is True and state["power"] == 0.5
    gathered = load_file(single / "pretrained_model_ema" / "model.safetensors")
    names = state["shadow_param_names"]
    assert all(torch.equal(t, gathered[n]) for n, t in zip(names, state["shadow_params"], strict=True))
    assert (fsdp / "pretrained_model_ema" / "pytorch_model_fsdp_0" / ".metadata").is_file()
    assert not (fsdp / "training_state" / "ema_state.pt").exists()
    saved = json.loads((fsdp / "training_state" / "save_files.json").read_text())
    assert any("pretrained_model_ema/pytorch_model_fsdp_0/" in name for name in json.dumps(saved).split('"'))


def test_convert_ema_refusals(runs: dict[str, Path]) -> None:
    gathered = invoke_cli("convert-dcp", str(step_dir(runs["single"], 4)), "--ema")
    assert gathered.returncode == 3
    assert "the EMA weights are already in safetensors form" in gathered.stderr


@pytest.mark.parametrize("layout", ["single", "fsdp"])
def test_ema_off_on_an_ema_checkpoint_is_refused_with_the_tools_line(
    runs: dict[str, Path], layout: str, tmp_path: Path
) -> None:
    step = step_dir(runs[layout], 2)
    config = json.loads((step / "pretrained_model" / "train_config.json").read_text())
    config["ema"]["enable"] = False
    off = tmp_path / "train_config.json"
    off.write_text(json.dumps(config))
    # onto one process: the FSDP checkpoint's shards reshard there (the refusal comes first)
    one = ["--nproc", "1", "--dp-shard", "1", "--checkpoint-format", "safetensors"]
    report = invoke_cli("verify-resume", str(step), "--config", str(off), *one, "--json")
    line = next(c["message"] for c in json.loads(report.stdout)["checks"] if c["name"] == "ema")
    assert "--ema.enable=false, but this checkpoint holds EMA state" in line
    flags = ["--parallelism.dp_replicate=1", "--parallelism.dp_shard=1", "--checkpoint_format=safetensors"]
    trainer = train(
        "--resume=true", f"--config_path={step}", "--ema.enable=false", *flags, f"--output_dir={tmp_path}/o"
    )
    assert trainer.returncode != 0
    assert f"error: {line}" in trainer.stderr.splitlines()


def test_async_save_writes_the_synchronous_ema(runs: dict[str, Path]) -> None:
    assert json.loads((step_dir(runs["single-resumed"], 4) / "pretrained_model" / "train_config.json").read_text())[
        "checkpoint_async"
    ]
    for step in (4,):
        sync, background = step_dir(runs["single"], step), step_dir(runs["single-resumed"], step)
        for rel in ("pretrained_model_ema/model.safetensors", "training_state/ema_state.pt"):
            if rel.endswith(".safetensors"):
                a, b = load_file(sync / rel), load_file(background / rel)
                assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), rel
            else:
                a, b = torch.load(sync / rel, weights_only=True), torch.load(background / rel, weights_only=True)
                assert all(torch.equal(x, y) for x, y in zip(a["shadow_params"], b["shadow_params"], strict=True))


@pytest.mark.parametrize("layout", ["single", "fsdp"])
def test_inspect_finds_our_ema_consistent(runs: dict[str, Path], layout: str) -> None:
    report = json.loads(invoke_cli("inspect", str(step_dir(runs[layout], 4)), "--json").stdout)
    assert report["healthy"] and report["ema"]["consistent"] and report["ema"]["updates"] == 4
    forms = {f["form"] for f in report["ema"]["forms"]}
    assert forms == ({"dcp"} if layout == "fsdp" else {"safetensors", "ema_state.pt"})


def test_a_changed_ema_schedule_is_refused_by_trainer_and_verify_resume(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step = step_dir(runs["single"], 2)
    config = json.loads((step / "pretrained_model" / "train_config.json").read_text())
    config["ema"]["power"] = 0.6
    changed = tmp_path / "train_config.json"
    changed.write_text(json.dumps(config))
    report = invoke_cli("verify-resume", str(step), "--config", str(changed), "--nproc", "1", "--json")
    line = next(c["message"] for c in json.loads(report.stdout)["checks"] if c["name"] == "hyperparameters")
    assert line.endswith(
        "--ema.power 0.5 → 0.6: the EMA shadow was built with the values ema_state.pt holds; resume with those"
        " (a changed EMA schedule does not continue the saved run)"
    )
    # The trainer refuses before any process group: its entry point, called here, says the same line.
    argv = ["--resume=true", f"--config_path={step}", "--ema.power=0.6", f"--output_dir={tmp_path}/o"]
    assert refused_in_process(argv, capsys, code=3) == f"error: {line}"
