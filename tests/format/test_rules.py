"""The start-up and resume rules both halves call: each tested once, as plain functions."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import pytest

from ckpt_tools.facts.resumable import unresumable_reason
from ckpt_tools.format import manifest
from ckpt_tools.format.dataset import stats_problem
from ckpt_tools.format.layout import StepPaths, split_flat_optimizer_key
from ckpt_tools.format.param_groups import split_flat_key
from ckpt_tools.format.record import BatchFactorization, Topology, TrainingStep, layout_for
from ckpt_tools.format.rules import resume_output
from ckpt_tools.format.rules.data_order import DataOrderChange
from ckpt_tools.format.rules.ignored_modules import (
    ignored_regex,
    module_is_ignored,
    parameter_is_ignored,
    pattern_problem,
)
from ckpt_tools.format.rules.scaling import linear_scaling
from ckpt_tools.format.rules.startup import (
    RunSettings,
    default_save_freq,
    default_save_freq_note,
    resolve_parallelism,
    setting_refusals,
    world_refusals,
)
from ckpt_tools.format.train_config import read_saved_config

# ====================================================================== parallelism


def _expected_mesh(r: int, s: int, world: int) -> tuple[int, int] | None:
    """The rule stated independently: R ≥ 1; S ≥ 1 or -1 (the rest); 1×1 on many is DDP; R×S = world."""
    if r < 1 or (s < 1 and s != -1):
        return None
    if s == -1:
        if world % r:
            return None
        s = world // r
    if (r, s) == (1, 1):
        return (world, 1)
    return (r, s) if r * s == world else None


def test_resolve_parallelism_over_a_grid() -> None:
    for world, r, s in itertools.product([1, 2, 3, 4, 6, 8], [-1, 0, 1, 2, 3, 4], [-2, -1, 0, 1, 2, 3, 4, 8]):
        mesh, refusal = resolve_parallelism(r, s, world)
        assert mesh == _expected_mesh(r, s, world), (world, r, s)
        assert (refusal is None) == (mesh is not None), (world, r, s)
        if mesh is not None:
            layout_for(world, *mesh)  # a mesh that multiplies out to the world size


@pytest.mark.parametrize(
    ("r", "s", "world", "line"),
    [
        (0, 1, 2, "--parallelism.dp_replicate=0: must be ≥ 1"),
        (1, 0, 2, "--parallelism.dp_shard=0: must be ≥ 1 or -1 (all launched processes)"),
        (3, -1, 4, "--parallelism.dp_shard=-1 with --parallelism.dp_replicate=3: world size 4 is not divisible by 3"),
        (
            1,
            3,
            2,
            "--parallelism.dp_replicate × --parallelism.dp_shard = 1×3 = 3 ≠ world size 2 (processes launched);"
            " pass --parallelism.dp_replicate=1 --parallelism.dp_shard=2 (FSDP)"
            " or --parallelism.dp_replicate=1 --parallelism.dp_shard=1 (DDP)",
        ),
        (
            2,
            2,
            1,
            "--parallelism.dp_replicate × --parallelism.dp_shard = 2×2 = 4 ≠ world size 1 (processes launched);"
            " pass --parallelism.dp_replicate=1 --parallelism.dp_shard=1",
        ),
    ],
)
def test_parallelism_refusals_name_the_flags(r: int, s: int, world: int, line: str) -> None:
    mesh, refusal = resolve_parallelism(r, s, world)
    assert mesh is None and refusal is not None and refusal.message == line


def test_a_suggested_fix_resolves() -> None:
    for world in (1, 2, 3, 4, 6):
        _, refusal = resolve_parallelism(5, 5, world)
        assert refusal is not None and refusal.fixes
        for fix in refusal.fixes:
            values = dict(fix.settings)
            mesh, again = resolve_parallelism(values["dp_replicate"], values["dp_shard"], world)  # type: ignore[arg-type]
            assert mesh is not None and again is None


def test_non_sharded_world_refusals() -> None:
    dcp = RunSettings(checkpoint_format="safetensors_dcp", mixed_precision_policy={"param_dtype": "bfloat16"})
    mesh, refusals = world_refusals(dcp, 2)  # dp_replicate/dp_shard unset: 1×1, DDP over 2
    assert mesh == (2, 1)
    assert [r.message for r in refusals] == [
        "--checkpoint_format=safetensors_dcp: DCP shards need a sharded run (--parallelism.dp_shard > 1);"
        " pass --checkpoint_format=safetensors (what non-sharded runs save)",
        "--accelerator.fsdp.mixed_precision_policy.* applies to sharded runs only (use --accelerator.mixed_precision)",
    ]
    sharded = RunSettings(dp_shard=2, checkpoint_format="dcp", mixed_precision_policy={"param_dtype": "bfloat16"})
    assert world_refusals(sharded, 2) == ((1, 2), [])
    # A format that is no format at all is a setting refusal, not this one's.
    assert world_refusals(RunSettings(checkpoint_format="zip"), 1) == ((1, 1), [])
    mesh, refusals = world_refusals(RunSettings(dp_shard=3, checkpoint_format="dcp"), 2)
    assert mesh is None and len(refusals) == 1 and "≠ world size 2" in refusals[0].message


# ====================================================================== settings


def _lines(**settings: object) -> list[str]:
    return [r.message for r in setting_refusals(RunSettings(**settings))]  # type: ignore[arg-type]


def test_unknown_settings_are_not_checked() -> None:
    assert _lines() == []


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        ({"steps": 0}, "--steps=0: must be a positive integer"),
        ({"batch_size": -1}, "--batch_size=-1: must be a positive integer"),
        ({"log_freq": 0}, "--log_freq=0: must be a positive integer"),
        ({"collective_timeout_s": 0.0}, "--collective_timeout_s=0.0: must be positive (seconds)"),
        ({"grad_accum_steps": 0}, "--accelerator.gradient_accumulation.steps=0: must be ≥ 1"),
        (
            {"save_freq": 3, "grad_accum_steps": 2},
            "--save_freq=3: must be a multiple of --accelerator.gradient_accumulation.steps=2"
            " (a checkpoint must not fall inside an accumulation window); pass --save_freq=4",
        ),
        ({"checkpoint_format": "zip"}, "--checkpoint_format=zip: choose one of safetensors, dcp, safetensors_dcp"),
        ({"optimizer_type": "sgd"}, "--optimizer.type=sgd: only adamw is supported"),
        ({"lr": 0.0}, "--optimizer.lr=0.0: must be positive"),
        ({"scheduler_type": "step"}, "--scheduler.type=step: choose cosine or constant"),
        ({"mixed_precision": "fp8"}, "--accelerator.mixed_precision=fp8: choose no, bf16 or fp16"),
        (
            {"wrap_modules": ["Block"], "min_num_params": 10},
            "--accelerator.fsdp.wrap_modules and --accelerator.fsdp.min_num_params are exclusive: pass one",
        ),
        ({"min_num_params": 0}, "--accelerator.fsdp.min_num_params=0: must be positive"),
        (
            {"ignored_modules": "enc(oder"},
            "--accelerator.fsdp.ignored_modules: not a valid regex (missing ), unterminated subpattern at position 3)",
        ),
        (
            {"mixed_precision_policy": {"param_dtype": "fp32"}},
            "--accelerator.fsdp.mixed_precision_policy.param_dtype=fp32: choose float32, bfloat16 or float16",
        ),
        (
            {"mixed_precision_policy": {"reduce_dtype": "float32"}},
            "--accelerator.fsdp.mixed_precision_policy.param_dtype is required once any mixed_precision_policy"
            " field is set (the policy is built from those fields alone)",
        ),
        (
            {"mixed_precision_policy": {"param_dtype": "float16"}, "mixed_precision": "bf16"},
            "--accelerator.fsdp.mixed_precision_policy.*=float16 needs --accelerator.mixed_precision=fp16"
            " (it builds the loss scaler)",
        ),
        ({"peft": True, "peft_method": "IA3", "policy_path": "p"}, "--peft.method_type=IA3: only LORA is supported"),
        (
            {"peft": True},
            "--peft.* needs --policy.path (the saved base policy the adapter is trained on)",
        ),
        ({"peft": True, "policy_path": "p", "peft_r": 0}, "--peft.r=0: must be positive"),
        ({"weight_decay": -0.1}, "--optimizer.weight_decay=-0.1: must be ≥ 0"),
        ({"betas": (0.9, 1.0)}, "--optimizer.betas=[0.9, 1.0]: must be two numbers in [0, 1)"),
        ({"eps": -1e-8}, "--optimizer.eps=-1e-08: must be ≥ 0"),
        ({"grad_clip_norm": -1.0}, "--optimizer.grad_clip_norm=-1.0: must be ≥ 0 (0 disables clipping)"),
        ({"warmup_steps": -1}, "--scheduler.warmup_steps=-1: must be ≥ 0"),
        (
            {"min_lr_ratio": 1.5},
            "--scheduler.min_lr_ratio=1.5: must be between 0 and 1 (the fraction of --optimizer.lr the cosine"
            " schedule ends at)",
        ),
        ({"dropout": 2.0}, "--policy.dropout=2.0: must be between 0 and 1"),
        (
            {"max_nonfinite_steps": -1},
            "--max_nonfinite_steps=-1: must be ≥ 0 (0: stop at the first non-finite loss)",
        ),
        (
            {"lr": 1e38, "betas": (0.9, 0.999)},
            "--optimizer.lr=1e+38: too large: AdamW's first step size, lr / (1 - betas[0]) = 1e+39, overflows float32",
        ),
        (
            {"lr": 1e36, "weight_decay": 1e3},
            "--optimizer.lr=1e+36 × --optimizer.weight_decay=1000.0 = 1e+39 overflows float32",
        ),
    ],
)
def test_each_setting_refusal(settings: dict[str, object], line: str) -> None:
    assert _lines(**settings) == [line]


@pytest.mark.parametrize(("accum", "chosen"), [(1, 50), (2, 50), (3, 51), (4, 52), (7, 56), (64, 64)])
def test_the_default_save_freq_is_a_whole_number_of_accumulation_windows(accum: int, chosen: int) -> None:
    """LeRobot's `--accelerator.gradient_accumulation.steps=4` without `--save_freq` must start."""
    assert default_save_freq(accum) == chosen
    assert _lines(save_freq=chosen, grad_accum_steps=accum) == []
    note = default_save_freq_note(accum)
    if accum == 1:
        assert note is None
    else:
        assert note is not None and f"a checkpoint every {chosen} loop steps" in note
        assert f"--accelerator.gradient_accumulation.steps={accum}: every {chosen // accum} optimizer updates" in note
        assert ("50 rounded up" in note) == (chosen != 50)


def test_passing_settings_are_quiet() -> None:
    good = RunSettings(
        steps=10,
        batch_size=8,
        save_freq=4,
        log_freq=1,
        collective_timeout_s=600.0,
        grad_accum_steps=2,
        checkpoint_format="dcp",
        optimizer_type="adamw",
        lr=1e-4,
        scheduler_type="constant",
        mixed_precision="fp16",
        wrap_modules=["Block"],
        ignored_modules=r"encoder\..*",
        mixed_precision_policy={"param_dtype": "float16"},
        peft=True,
        peft_method="lora",  # the trainer upper-cases it
        peft_r=8,
        policy_path="base",
        numbers=(("--optimizer.lr", 1e-4), ("--optimizer.betas", [0.9, 0.999])),
        weight_decay=0.0,
        betas=(0.0, 0.999),
        eps=0.0,
        grad_clip_norm=0.0,
        warmup_steps=0,
        min_lr_ratio=1.0,
        dropout=0.0,
        max_nonfinite_steps=3,
    )
    assert setting_refusals(good) == []


@pytest.mark.parametrize(
    ("dotted", "value", "line"),
    [
        ("optimizer.lr", math.nan, "--optimizer.lr=nan: must be a finite number"),
        ("scheduler.min_lr_ratio", math.nan, "--scheduler.min_lr_ratio=nan: must be a finite number"),
        ("optimizer.weight_decay", -math.inf, "--optimizer.weight_decay=-inf: must be a finite number"),
        ("optimizer.betas", [0.9, math.inf], "--optimizer.betas=[0.9, inf]: every value must be a finite number"),
        ("optimizer.eps", math.nan, "--optimizer.eps=nan: must be a finite number"),
        ("optimizer.grad_clip_norm", math.inf, "--optimizer.grad_clip_norm=inf: must be a finite number"),
        ("collective_timeout_s", math.inf, "--collective_timeout_s=inf: must be a finite number"),
        ("policy.dropout", math.nan, "--policy.dropout=nan: must be a finite number"),
        ("peft.lora_dropout", math.nan, "--peft.lora_dropout=nan: must be a finite number"),
    ],
)
def test_a_non_finite_float_is_refused_wherever_it_is(dotted: str, value: object, line: str, tmp_path: Path) -> None:
    """Through ``train_config.json`` as the tools read it (NaN and Infinity are JSON tokens ``json`` accepts);
    the trainer reads its own flags through the same object (tests/train/test_train_startup.py)."""
    config: dict = {
        "steps": 10,
        "collective_timeout_s": 600.0,
        "optimizer": {"lr": 1e-4, "weight_decay": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "grad_clip_norm": 10.0},
        "scheduler": {"type": "cosine", "warmup_steps": 0, "min_lr_ratio": 0.1},
        "policy": {"type": "act", "dropout": 0.1, "path": "base"},  # a PEFT run needs its base
        "peft": {"method_type": "LORA", "lora_dropout": 0.0},
    }
    group, _, name = dotted.rpartition(".")
    (config[group] if group else config)[name] = value
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(config))
    settings = read_saved_config(path).run_settings()
    assert [r.message for r in setting_refusals(settings)] == [line]


def test_every_refusal_is_listed_in_the_trainers_order() -> None:
    lines = _lines(steps=0, grad_accum_steps=2, save_freq=3, mixed_precision="fp8", peft=True)
    assert [line.split(":")[0].split("=")[0] for line in lines] == [
        "--steps",
        "--save_freq",
        "--accelerator.mixed_precision",
        "--peft.* needs --policy.path (the saved base policy the adapter is trained on)",
    ]


# ====================================================================== dataset statistics

DIMS = {"observation.state": 2, "action": 3}


def _stats(**changes: object) -> dict:
    stats = {
        "observation.state": {"mean": [0.0, 1.0], "std": [1.0, 0.5]},
        "action": {"mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 2.0]},
    }
    for dotted, value in changes.items():
        column, key, index = dotted.split(":")
        stats[column][key][int(index)] = value
    return stats


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        ({"action:std:1": 0.0}, "meta/stats.json: action.std[1]=0.0: must be a finite number above 0"),
        ({"action:std:2": -1.0}, "meta/stats.json: action.std[2]=-1.0: must be a finite number above 0"),
        (
            {"observation.state:mean:1": math.nan, "observation.state:mean:0": math.inf},
            "meta/stats.json: observation.state.mean[0]=inf (and 1 more): must be a finite number",
        ),
        (
            {"observation.state:std:0": math.nan},
            "meta/stats.json: observation.state.std[0]=nan: must be a finite number above 0",
        ),
    ],
)
def test_dataset_statistics_must_be_finite_with_a_positive_std(changes: dict[str, object], line: str) -> None:
    assert stats_problem(_stats(**changes), DIMS) == line


def test_dataset_statistics_must_describe_each_normalized_column() -> None:
    assert stats_problem(_stats(), DIMS) is None
    assert stats_problem({"action": _stats()["action"]}, DIMS) == "meta/stats.json: no statistics for observation.state"
    assert stats_problem(_stats(), {"action": 4}) == (
        "meta/stats.json: action.mean has 3 values, the frames' action has 4"
    )
    broken = _stats()
    broken["action"]["std"] = "1.0"
    assert stats_problem(broken, DIMS) == "meta/stats.json: action.std is not a list of numbers"


# ====================================================================== data order and scaling


def test_sample_exact_only_with_the_same_split() -> None:
    same = DataOrderChange(2, 8, 2, 8)
    assert same.sample_exact is True
    assert same.describe() == "sample-exact: same dp_world_size 2 and batch_size 8"
    for change in (DataOrderChange(2, 8, 4, 8), DataOrderChange(2, 8, 2, 4), DataOrderChange(4, 4, 2, 8)):
        assert change.sample_exact is False  # 4×4 and 2×8 consume the same 16 per step, split differently
        assert change.describe().startswith("not sample-exact: dp_world_size ")
        assert "no sample of the epoch is skipped or repeated" in change.describe()
    unknown = DataOrderChange(None, 8, 2, 8)
    assert unknown.sample_exact is None and unknown.describe().startswith("unknown:")


def test_linear_scaling_keeps_lr_per_sample_and_the_remaining_samples() -> None:
    before, after = BatchFactorization(8, 2, 1), BatchFactorization(8, 4, 1)  # 16 → 32 per step
    scaling = linear_scaling(before, after, lr=1e-3, steps=100, step=40)
    assert scaling.lr_after == pytest.approx(2e-3)
    assert scaling.remaining_samples == 60 * 16
    assert scaling.steps_after == 40 + 30
    assert not scaling.unchanged
    assert scaling.describe() == (
        "linear scaling suggests --optimizer.lr=0.002 (lr × 32/16)"
        " and --steps=70 (the same 960 remaining samples at 32/step)"
    )
    # Uneven: never fewer samples than before (the last step is rounded up).
    assert linear_scaling(before, BatchFactorization(8, 3, 1), lr=None, steps=10).steps_after == 7
    # Accumulation changes the effective batch, not the samples per step: lr only.
    accum = linear_scaling(before, BatchFactorization(8, 2, 2), lr=1e-3, steps=100, step=40)
    assert accum.steps_after == 100 and accum.describe() == "linear scaling suggests --optimizer.lr=0.002 (lr × 32/16)"
    same = linear_scaling(before, BatchFactorization(4, 4, 1), lr=1e-3, steps=100, step=40)
    assert same.unchanged and same.describe() == ""
    assert linear_scaling(before, after, lr=None, steps=None).describe() == ""
    # A batch of no samples (a train_config.json edited to batch_size 0) scales nothing; the start-up rules refuse it.
    empty = linear_scaling(before, BatchFactorization(0, 4, 1), lr=1e-3, steps=100, step=40)
    assert empty.describe() == "" and empty.steps_after == 100


# ====================================================================== ignored modules


def test_ignored_modules_match_whole_paths_and_cover_what_is_below() -> None:
    regex = ignored_regex(r"encoder\.layers\.\d+")
    assert regex is not None
    assert module_is_ignored("encoder.layers.0", regex)
    assert not module_is_ignored("encoder.layers.0.attn", regex)  # a full match, not a prefix
    assert not module_is_ignored("", regex)  # the root never is
    assert parameter_is_ignored("encoder.layers.0.attn.weight", regex)  # below an ignored module
    assert not parameter_is_ignored("encoder.layers.weight", regex)
    assert not parameter_is_ignored("decoder.layers.0.weight", regex)
    peft = ignored_regex(r"base_model\.model\.head")
    assert parameter_is_ignored("head.weight", peft, "base_model.model.")
    assert not parameter_is_ignored("head.weight", peft)
    assert ignored_regex(None) is None and ignored_regex("") is None
    assert ignored_regex("a(") is None and pattern_problem("a(") == str(_re_error("a("))
    assert pattern_problem(None) is None and pattern_problem("a|b") is None
    assert pattern_problem("(" * 100_000 + ")" * 100_000) == "nested too deeply"
    assert pattern_problem("a{99999999999}") == "the repetition number is too large"


def _re_error(pattern: str) -> re.error:
    try:
        re.compile(pattern)
    except re.error as e:
        return e
    raise AssertionError(pattern)


# ====================================================================== flat optimizer keys


def test_flat_optimizer_keys_split_in_both_forms() -> None:
    names = ["w", "encoder.layers.0.weight", "a.b"]
    for position, (param, slot) in enumerate(zip(names, ("step", "exp_avg", "exp_avg_sq"), strict=True)):
        # ckpt-train's earlier keys (still read) and LeRobot's, which it writes now.
        assert split_flat_optimizer_key(f"state.{param}.{slot}") == (param, slot)
        assert split_flat_key(f"state/{position}/{slot}", names) == (param, slot)
        assert split_flat_key(f"state/{position}/{slot}", None) == (str(position), slot)  # LeRobot's own file
    assert split_flat_key("state/3/step", names) == ("3", "step")  # past the names: no group lists it
    assert split_flat_optimizer_key("stray") == ("", "stray")  # no parameter: the loader refuses it


def test_a_sharded_checkpoint_is_resumable_only_with_the_optimizer_state_the_loader_chooses(tmp_path: Path) -> None:
    """``optimizer_0/`` without ``.metadata`` (its save did not complete) holds no optimizer state to read."""
    step = StepPaths(tmp_path / "000004")
    record = TrainingStep(step=4, samples_seen=8, topology=Topology(2, 1, 2), sharded=True)

    def reason() -> str | None:
        chosen = manifest.choose(manifest.optimizer_inputs(), step)
        return unresumable_reason(step, record, has_optimizer=chosen is not None)

    assert "optimizer_0: missing - this sharded checkpoint holds no optimizer state" in (reason() or "")
    step.optimizer_dcp.mkdir(parents=True)
    assert "optimizer_0: no .metadata (its save did not complete) - this sharded checkpoint" in (reason() or "")
    (step.optimizer_dcp / ".metadata").touch()
    assert reason() is None


# ====================================================================== where a resume writes


def _run_with(tmp_path: Path, *names: str, last: str) -> Path:
    run = tmp_path / "run"
    for name in names:
        (run / "checkpoints" / name).mkdir(parents=True)
    (run / "checkpoints" / ".000016.partial").mkdir()  # a crashed save is no checkpoint to keep
    (run / "checkpoints" / "last").symlink_to(last)
    return run


def test_a_resume_refuses_to_save_over_checkpoints_after_its_step(tmp_path: Path) -> None:
    run = _run_with(tmp_path, "000004", "000008", "000012", last="000012")
    step = StepPaths(run / "checkpoints" / "000004")
    refusal = resume_output.check_output(step, 4, run, overwrite=False).refusal or ""
    assert refusal.startswith(f"--output_dir={run}: holds checkpoints after step 4 (000008, 000012)")
    assert f"resume from {run / 'checkpoints' / '000012'} instead" in refusal
    assert refusal.endswith("or pass --overwrite_checkpoints=true to replace them")
    newest = resume_output.check_output(StepPaths(run / "checkpoints" / "000012"), 12, run, overwrite=False)
    assert newest == resume_output.OutputCheck()  # from the newest, into its own run: nothing to say
    allowed = resume_output.check_output(step, 4, run, overwrite=True)
    assert allowed.refusal is None and len(allowed.notices) == 1
    assert allowed.notices[0].startswith("--overwrite_checkpoints=true: the checkpoints after step 4")
    assert "(000008, 000012)" in allowed.notices[0]


def test_a_commit_cut_off_before_moving_last_does_not_stop_a_restart(tmp_path: Path) -> None:
    """``last`` still at 4, 000008 renamed into place: a resume from ``last`` goes on, and says so."""
    run = _run_with(tmp_path, "000004", "000008", last="000004")
    verdict = resume_output.check_output(StepPaths(run / "checkpoints" / "000004"), 4, run, overwrite=False)
    assert verdict.refusal is None
    assert verdict.notices == (
        f"{run / 'checkpoints' / '000008'} is complete but {run / 'checkpoints' / 'last'} points at step 4"
        " (a save stopped between its rename and moving last): this resume saves that step again, over it",
    )
    two_after = _run_with(tmp_path / "b", "000004", "000008", "000012", last="000004")  # not one cut-off commit
    step = StepPaths(two_after / "checkpoints" / "000004")
    assert resume_output.check_output(step, 4, two_after, overwrite=False).refusal is not None


def test_a_resume_into_another_directory_says_so(tmp_path: Path) -> None:
    step = StepPaths(tmp_path / "run" / "checkpoints" / "000004")
    assert step.run_dir == tmp_path / "run"
    assert resume_output.check_output(step, 4, tmp_path / "run", overwrite=False).notices == ()
    assert resume_output.check_output(step, 4, tmp_path / "other", overwrite=False).notices == (
        f"resuming step 000004 of run {tmp_path / 'run'} into --output_dir={tmp_path / 'other'}:"
        " the new checkpoints go there",
    )
    loose = StepPaths(tmp_path / "000004")  # a step dir outside any checkpoints/: it belongs to no run
    assert loose.run_dir is None
    (notice,) = resume_output.check_output(loose, 4, tmp_path / "run", overwrite=False).notices
    assert "(not in a run's checkpoints/)" in notice
