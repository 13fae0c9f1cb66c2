"""Start-up refusals: one clear line naming the flag or variable, a non-zero exit, no traceback."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_tools.errors import ConfigError
from ckpt_tools.format.ema import EmaSchedule
from ckpt_tools.format.rules.startup import CHECKPOINT_FORMATS, MIXED_PRECISION_CHOICES, POLICY_DTYPES, RunSettings
from ckpt_tools.train.config import FSDPConfig, train_config_dict
from ckpt_tools.train.env_guard import check_accelerate_env
from ckpt_tools.train.parallel.wrap import check_tied_weights, root_only_warning, select_wrap_units
from ckpt_tools.train.parsing import flag_names, parse_train_args, parse_train_config
from ckpt_tools.train.policies.configs import ACTConfig, MLPConfig, TiedACTConfig
from ckpt_tools.train.policies.registry import make_policy
from devtools.procs import launch_env
from devtools.training import FIXTURE_DATASET, TINY, ok, script, train
from tests.support.run_copy import copy_run
from tests.support.train_cli import RULE_SETTINGS, exits_in_process, refused_in_process


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


ENGINE_ENV = {
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_SHARDING_STRATEGY": "FULL_SHARD",
    "ACCELERATE_MIXED_PRECISION": "bf16",
}


@pytest.fixture
def no_engine_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    launcher = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_CPU")
    for name in (*ENGINE_ENV, "LEROBOT_ALLOW_ACCELERATE_ENV", "CKPT_TOOLS_ALLOW_ACCELERATE_ENV", *launcher):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--policy.type=transformer"], "--policy.type=transformer: unknown policy type (choose act, act_tied, mlp)"),
        (["--stepz=3"], "unknown flag --stepz (did you mean --steps?)"),
        (["--steps=abc"], "--steps: Couldn't parse 'abc' into an int"),
        (
            ['--accelerator.fsdp.wrap_modules=["ACTEncoderLayer"]', "--accelerator.fsdp.min_num_params=1000"],
            "--accelerator.fsdp.wrap_modules and --accelerator.fsdp.min_num_params are exclusive",
        ),
        (
            ["--accelerator.fsdp.mixed_precision_policy.param_dtype=float16"],
            "--accelerator.fsdp.mixed_precision_policy.*=float16 needs --accelerator.mixed_precision=fp16",
        ),
        (
            ["--accelerator.fsdp.mixed_precision_policy.reduce_dtype=float32"],
            "--accelerator.fsdp.mixed_precision_policy.param_dtype is required",
        ),
        (["--accelerator.mixed_precision=fp8"], "--accelerator.mixed_precision=fp8: choose no, bf16 or fp16"),
        (["--save_freq=3", "--accelerator.gradient_accumulation.steps=2"], "--save_freq=3: must be a multiple of"),
        (["--resume=true"], "--resume=true needs --config_path="),
        (["--checkpoint_format=zip"], "--checkpoint_format=zip: choose one of safetensors, dcp, safetensors_dcp"),
        (["--policy.type=mlp"], "--policy.dim_model: the mlp policy has no such field"),
        (["--accelerator.fsdp.ignored_modules=enc(oder"], "--accelerator.fsdp.ignored_modules: not a valid regex"),
        (["--peft.method_type=LORA", "--peft.r=4"], "--peft.* needs --policy.path"),
        (["--scheduler.min_lr_ratio=nan"], "--scheduler.min_lr_ratio=nan: must be a finite number"),
        (["--optimizer.lr=nan"], "--optimizer.lr=nan: must be a finite number"),
        (["--optimizer.lr=1e400"], "--optimizer.lr=inf: must be a finite number"),
        (["--optimizer.betas=[0.9,nan]"], "--optimizer.betas=[0.9, nan]: every value must be a finite number"),
        (["--optimizer.lr=1e39"], "--optimizer.lr=1e+39: too large: AdamW's first step size"),
        (["--max_nonfinite_steps=-1"], "--max_nonfinite_steps=-1: must be ≥ 0"),
        # `--dataset.repo_id=${HF_USER}/my_dataset` with HF_USER unset
        (["--dataset.repo_id=/my_dataset"], "--dataset.repo_id: '/my_dataset' is not a Hub repo id"),
    ],
)
def test_bad_flags_are_refused_with_one_line(
    flags: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_engine_env: object
) -> None:
    line = refused_in_process([*TINY, *flags, f"--output_dir={tmp_path / 'out'}"], capsys)
    assert needle in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flags, world, needle",
    [
        (["--checkpoint_format=dcp"], 1, "--checkpoint_format=dcp: DCP shards need a sharded run"),
        (
            ["--parallelism.dp_shard=3"],
            2,
            "--parallelism.dp_replicate × --parallelism.dp_shard = 1×3 = 3 ≠ world size 2 (processes launched);"
            " pass --parallelism.dp_replicate=1 --parallelism.dp_shard=2 (FSDP)",
        ),
        (
            ["--parallelism.dp_shard=2", "--accelerator.fsdp.mixed_precision_policy.param_dtype=bfloat16"],
            1,
            "--parallelism.dp_replicate × --parallelism.dp_shard = 1×2 = 2 ≠ world size 1",
        ),
        (
            ["--accelerator.fsdp.mixed_precision_policy.param_dtype=bfloat16"],
            2,
            "--accelerator.fsdp.mixed_precision_policy.* applies to sharded runs only",
        ),
    ],
)
def test_the_world_size_refusals(flags: list[str], world: int, needle: str, tmp_path: Path) -> None:
    """What only the launched world size refuses, checked once the process group exists."""
    cfg, _ = parse_train_config([*TINY, *flags, f"--output_dir={tmp_path / 'out'}"])
    cfg.validate()
    with pytest.raises(ConfigError) as refused:
        cfg.validate_for_world(world)
    assert needle in str(refused.value)


def test_a_refusal_is_one_line_and_exit_2_from_the_command(tmp_path: Path) -> None:
    """The contract end to end: a real ``ckpt-train`` process, refused before and after its process group."""
    before = train(*TINY, "--accelerator.mixed_precision=fp8", f"--output_dir={tmp_path / 'a'}")
    assert before.returncode == 2 and "choose no, bf16 or fp16" in one_error_line(before)
    after = train(*TINY, "--checkpoint_format=dcp", f"--output_dir={tmp_path / 'b'}")
    assert after.returncode == 2 and "DCP shards need a sharded run" in one_error_line(after)
    assert not (tmp_path / "b" / "checkpoints").exists()


def test_a_dataset_with_a_nan_statistic_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Found when the dataset loads (the process group exists by then): a real ``ckpt-train`` process."""
    root = tmp_path / "dataset"
    shutil.copytree(FIXTURE_DATASET, root)
    stats_path = root / "meta" / "stats.json"
    stats = json.loads(stats_path.read_text())
    stats["action"]["std"][5] = math.nan
    stats_path.write_text(json.dumps(stats))
    flags = [a for a in TINY if not a.startswith("--dataset.")]
    proc = train(*flags, f"--dataset.root={root}", f"--output_dir={tmp_path / 'out'}")
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert line == f"error: dataset {root}: meta/stats.json: action.std[5]=nan: must be a finite number above 0"
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_gradient_accumulation_without_save_freq_starts(tmp_path: Path) -> None:
    """LeRobot's `--batch_size=8 --accelerator.gradient_accumulation.steps=4 ...`, no --save_freq: it starts.

    The default is rounded to whole accumulation windows and said; an explicit value is not
    rounded, and its refusal names the value that would pass.
    """
    flags = [*TINY, "--batch_size=8", "--accelerator.gradient_accumulation.steps=4", f"--output_dir={tmp_path}"]
    parsed = parse_train_args(flags)
    parsed.cfg.validate()
    assert parsed.cfg.save_freq == 52 and train_config_dict(parsed.cfg)["save_freq"] == 52  # what ran is saved
    assert parsed.notes == (
        "--save_freq not given: a checkpoint every 52 loop steps (50 rounded up to a multiple of"
        " --accelerator.gradient_accumulation.steps=4: every 13 optimizer updates)",
    )
    assert parse_train_args(flags[:-2] + flags[-1:]).notes == ()  # no accumulation: the plain default, unsaid
    explicit, _ = parse_train_config([*flags, "--save_freq=50"])
    with pytest.raises(ConfigError, match=r"--save_freq=50: must be a multiple of .*; pass --save_freq=52$"):
        explicit.validate()


@pytest.mark.parametrize(
    "env, needle",
    [
        (
            # what `accelerate launch --num_processes=2` exports to the one process it starts without GPUs
            {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "ACCELERATE_USE_CPU": "False"},
            "error: accelerate launch started one process without RANK and WORLD_SIZE: with fewer than 2 GPUs it"
            " starts --num_processes processes only when given --multi_gpu; add --multi_gpu",
        ),
        (
            {"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "2"},
            "error: MASTER_ADDR is set but RANK not: start several processes with torchrun --nproc-per-node=N",
        ),
    ],
)
def test_a_launch_that_gave_no_rank_names_the_fix(
    env: dict[str, str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_engine_env: object
) -> None:
    for name, value in env.items():
        no_engine_env.setenv(name, value)  # type: ignore[attr-defined]
    line = refused_in_process([*TINY, f"--output_dir={tmp_path / 'out'}"], capsys)
    assert line.startswith(needle)
    assert not (tmp_path / "out").exists()


def test_a_peft_run_without_peft_installed_says_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_engine_env: pytest.MonkeyPatch
) -> None:
    no_engine_env.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError, as when not installed
    line = refused_in_process([*TINY, "--peft.r=4", f"--output_dir={tmp_path / 'out'}"], capsys)
    assert line.startswith("error: ckpt-train needs the `training` extra: peft cannot be imported")


def test_help_describes_every_flag_with_its_choices_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = exits_in_process(["--help"], capsys, 0)
    blocks: dict[str, str] = {}
    for chunk in out.split("\n  --")[1:]:
        name, _, rest = chunk.partition("=")
        blocks[name] = rest.split("\n\n")[0]
    accepted = flag_names() | {"config_path"}
    leaves = {n for n in accepted if not any(other.startswith(n + ".") for other in accepted)}
    assert set(blocks) == leaves  # every flag the parser takes, and only those
    for name, block in blocks.items():
        text = " ".join(block.partition("\n")[2].split())
        assert len(text.split()) >= 4 and "Default: " in text, name
    choices = {
        "policy.type": ("act", "act_tied", "mlp"),
        "checkpoint_format": CHECKPOINT_FORMATS,
        "accelerator.mixed_precision": MIXED_PRECISION_CHOICES,
        "accelerator.fsdp.mixed_precision_policy.param_dtype": POLICY_DTYPES,
        "scheduler.type": ("cosine", "constant"),
        "resume": ("true", "false", "auto"),
    }
    for name, values in choices.items():
        assert blocks[name].startswith("{" + ",".join(values) + "}"), name
    assert "Default: 50, rounded up to a multiple of --accelerator.gradient_accumulation.steps." in " ".join(
        blocks["save_freq"].split()
    )
    assert "--policy.dim_model=INT [act, act_tied]" in out  # a field of some policy types only says which


def test_a_size_rule_that_wraps_no_submodule_warns() -> None:
    """`--accelerator.fsdp.min_num_params=1000000` on a model whose submodules are all smaller: only the root."""
    policy = make_policy(ACTConfig(state_dim=14, action_dim=7, dim_model=32, dim_feedforward=64, n_heads=2))
    largest = max(sum(p.numel() for p in m.parameters()) for name, m in policy.named_modules() if name)
    fsdp = FSDPConfig(min_num_params=1_000_000)
    units, _ = select_wrap_units(policy, type(policy), fsdp)
    assert units == []
    assert root_only_warning(policy, fsdp, units) == (
        f"--accelerator.fsdp.min_num_params=1000000 wraps no submodule (the largest holds {largest:,} parameters):"
        " the root is the only FSDP unit, gathered whole in every forward and backward, so sharding saves no"
        f" memory; pass a value of at most {largest}, or --accelerator.fsdp.wrap_modules"
    )
    named = FSDPConfig(min_num_params=largest)  # the bound the warning names wraps a unit
    units, _ = select_wrap_units(policy, type(policy), named)
    assert units and root_only_warning(policy, named, units) is None


def test_a_saved_policy_is_not_republished_to_its_repo(tmp_path: Path) -> None:
    """A fine-tune or LoRA run on a published policy: its repo_id is not carried over (the run would push over it)."""
    policy = tmp_path / "base" / "pretrained_model"
    policy.mkdir(parents=True)
    (policy / "config.json").write_text(
        json.dumps({"type": "act", "dim_model": 32, "n_heads": 2, "repo_id": "alice/base", "private": True})
    )
    flags = [a for a in TINY if not a.startswith("--policy.")]
    parsed = parse_train_args([*flags, f"--policy.path={policy}", f"--output_dir={tmp_path / 'out'}"])
    assert parsed.cfg.policy is not None and parsed.cfg.policy.repo_id is None and not parsed.cfg.policy.private
    assert parsed.cfg.policy.dim_model == 32  # the rest of the saved config is
    assert parsed.notes == (
        f"--policy.path={policy} records policy.repo_id=alice/base (where its run was to publish):"
        " this run does not publish there"
        " (pass --policy.repo_id to publish it)",
    )
    own = parse_train_args(
        [*flags, f"--policy.path={policy}", "--policy.repo_id=alice/tuned", f"--output_dir={tmp_path}"]
    )
    assert own.cfg.policy is not None and own.cfg.policy.repo_id == "alice/tuned" and own.notes == ()


def test_the_trainer_checks_what_its_train_config_json_says(tmp_path: Path) -> None:
    """Every setting the start-up rules look at reaches them from the flags, through the saved form."""
    flags = [*RULE_SETTINGS, "--peft.method_type=lora", "--peft.r=4"]
    cfg, _ = parse_train_config([*TINY, *flags, f"--output_dir={tmp_path}"])
    assert cfg.run_settings() == RunSettings(
        steps=9,
        seed=1000,
        batch_size=4,
        save_freq=6,
        log_freq=3,
        collective_timeout_s=30.0,
        grad_accum_steps=2,
        checkpoint_format="dcp",
        optimizer_type="adamw",
        lr=3e-4,
        scheduler_type="constant",
        mixed_precision="fp16",
        wrap_modules=["ACTEncoderLayer"],
        min_num_params=None,
        ignored_modules=r"encoder\..*",
        mixed_precision_policy={"param_dtype": "float16", "cast_forward_inputs": False},
        peft=True,
        peft_method="lora",
        peft_r=4,
        policy_path=None,
        dp_replicate=2,
        dp_shard=-1,
        numbers=(
            ("--policy.dropout", 0.0),
            ("--collective_timeout_s", 30.0),
            ("--optimizer.lr", 3e-4),
            ("--optimizer.weight_decay", 0.01),
            ("--optimizer.betas", [0.8, 0.99]),
            ("--optimizer.eps", 1e-6),
            ("--optimizer.grad_clip_norm", 0.0),
            ("--scheduler.min_lr_ratio", 0.2),
            ("--peft.lora_dropout", 0.0),
            ("--ema.inv_gamma", 1.0),
            ("--ema.power", 0.75),
            ("--ema.min_decay", 0.0),
            ("--ema.max_decay", 0.9999),
        ),
        weight_decay=0.01,
        betas=[0.8, 0.99],
        eps=1e-6,
        grad_clip_norm=0.0,
        warmup_steps=3,
        min_lr_ratio=0.2,
        dropout=0.0,
        max_nonfinite_steps=2,
        keep_last_n=3,
        last_link="file",
        ema_enable=False,
        ema_schedule=EmaSchedule(),
    )
    other, _ = parse_train_config([*TINY, "--accelerator.fsdp.min_num_params=1000", f"--output_dir={tmp_path}"])
    assert other.run_settings().min_num_params == 1000 and not other.run_settings().peft


def test_accelerate_engine_variables_are_refused_unless_acknowledged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_engine_env: pytest.MonkeyPatch
) -> None:
    for name, value in ENGINE_ENV.items():
        no_engine_env.setenv(name, value)
    line = refused_in_process([*TINY, "--steps=1", f"--output_dir={tmp_path / 'a'}"], capsys)
    assert "ACCELERATE_MIXED_PRECISION, ACCELERATE_USE_FSDP, FSDP_SHARDING_STRATEGY" in line
    assert "LEROBOT_ALLOW_ACCELERATE_ENV=1" in line
    for allow in ("LEROBOT_ALLOW_ACCELERATE_ENV", "CKPT_TOOLS_ALLOW_ACCELERATE_ENV"):
        assert check_accelerate_env({**ENGINE_ENV, allow: "1"}) == sorted(ENGINE_ENV)
    # What a plain `accelerate launch` exports is not an engine configuration.
    assert check_accelerate_env({"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_DYNAMO_BACKEND": "NO"}) == []
    assert check_accelerate_env({"ACCELERATE_USE_CPU": "True"}) == []
    # Acknowledged, the run goes on and says what it ignores.
    env = {**ENGINE_ENV, "LEROBOT_ALLOW_ACCELERATE_ENV": "1"}
    proc = ok(train(*TINY, "--steps=1", "--save_freq=1", f"--output_dir={tmp_path / 'ack'}", env=env))
    assert "acknowledged and ignored" in proc.stdout


def test_existing_checkpoints_are_not_overwritten_without_resume(runs: dict[str, Path], tmp_path: Path) -> None:
    # Decided in the training loop's start (a process of its own: the refusal exits it at once).
    out = copy_run(runs["ddp"], tmp_path / "out")
    weights = out / "checkpoints" / "000004" / "pretrained_model" / "model.safetensors"
    before = weights.read_bytes()
    line = one_error_line(train(*TINY, "--steps=4", "--save_freq=4", f"--output_dir={out}"))
    assert "already holds checkpoints; pass --resume=true" in line
    assert weights.read_bytes() == before


def test_wrap_unit_rules_refuse_and_size_the_units_in_process() -> None:
    """The sharding start-up rules on the real policies: no declared units, tied weights split, a size rule."""
    mlp = make_policy(MLPConfig(state_dim=14, action_dim=7))
    with pytest.raises(ConfigError, match="the MLPPolicy policy declares no _fsdp_wrap_modules: pass --accelerator"):
        select_wrap_units(mlp, type(mlp), FSDPConfig())
    units, rule = select_wrap_units(mlp, type(mlp), FSDPConfig(min_num_params=1000))
    assert (len(units), rule) == (5, "every submodule ≥ 1,000 params")  # the banner's "wrap units" line
    tied = make_policy(TiedACTConfig(state_dim=14, action_dim=7, dim_model=32, dim_feedforward=64, n_heads=2))
    units, _ = select_wrap_units(tied, type(tied), FSDPConfig(wrap_modules=["TiedActionHead"]))
    with pytest.raises(ConfigError) as refused:
        check_tied_weights(tied, [path for path, _ in units])
    assert str(refused.value).startswith(
        "tied weights split across FSDP wrap units: parameter 'action_embedding.weight' is tied to"
        " 'action_head.proj.weight'"
    )
    check_tied_weights(tied, [path for path, _ in select_wrap_units(tied, type(tied), FSDPConfig())[0]])


@pytest.mark.torchrun
def test_a_multiprocess_refusal_is_one_line_from_rank_0(tmp_path: Path) -> None:
    """Decided on every rank after the process group is up: rank 0 prints it, the others stay quiet."""
    base = [a for a in TINY if not a.startswith("--policy.")]
    proc = train(*base, "--policy.type=mlp", "--parallelism.dp_shard=2", f"--output_dir={tmp_path / 'out'}", nproc=2)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1, proc.stderr  # printed by rank 0 only
    assert "the MLPPolicy policy declares no _fsdp_wrap_modules: pass --accelerator.fsdp.wrap_modules" in ours[0]
    assert "step 1:" not in proc.stdout  # refused before any step ran
    # torchrun's failure summary names the line and ckpt-train's exit code as its root cause
    # (the error file), not only "error_file: <N/A>" and a link.
    root_cause = proc.stderr.split("Root Cause", 1)[1]
    assert f"traceback : {ours[0]}" in root_cause, root_cause
    assert "(ckpt-train exit code 2: the launcher itself always exits 1)" in root_cause


@pytest.mark.torchrun
def test_tied_weights_stay_tied_under_fsdp(tmp_path: Path) -> None:
    """act_tied's declared units keep the tied pair in one unit: trained sharded, the saved pair is equal."""
    base = [a for a in TINY if not a.startswith("--policy.")]
    ok(
        train(
            *base,
            "--policy.type=act_tied",
            "--parallelism.dp_shard=2",
            "--steps=2",
            "--save_freq=2",
            f"--output_dir={tmp_path / 'tied'}",
            nproc=2,
        )
    )
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "tied/checkpoints/000002/pretrained_model/model.safetensors"))
    assert (weights["action_head.proj.weight"] == weights["action_embedding.weight"]).all()


@pytest.mark.torchrun
def test_accelerate_launch_as_a_plain_launcher(tmp_path: Path) -> None:
    # On a GPU-less machine accelerate needs --multi_gpu to start more than one process.
    cmd = [
        script("accelerate"),
        "launch",
        "--multi_gpu",
        "--num_processes=2",
        "--num_machines=1",
        "--mixed_precision=no",
        "--dynamo_backend=no",
        script("ckpt-train"),
        *TINY,
        "--parallelism.dp_shard=2",
        "--steps=2",
        "--save_freq=2",
        f"--output_dir={tmp_path / 'acc'}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FSDP over 2 shards" in proc.stdout
    assert (tmp_path / "acc/checkpoints/000002/training_state/optimizer_0/.metadata").exists()


@pytest.mark.torchrun
def test_accelerate_launch_without_multi_gpu_is_one_line(tmp_path: Path) -> None:
    """LeRobot's `accelerate launch --num_processes=2 $(which lerobot-train) ...` (with ckpt-train), on a machine without GPUs."""
    cmd = [script("accelerate"), "launch", "--num_processes=2", script("ckpt-train"), *TINY, f"--output_dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and "add --multi_gpu" in ours[0], proc.stderr[-3000:]
    assert "RANK expected" not in proc.stderr  # torch's traceback; accelerate's own report of the exit follows
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "content, needle",
    [
        ("[" * 100_000, "config.json: not valid JSON (JSON nested too deeply)"),
        (
            '{"type": "act", "dim_model": ' + "9" * 5000 + "}",
            "config.json: not valid JSON (integer of 5000 digits, more than 64 bits hold)",
        ),
        ("[1, 2]", "not a policy config (no 'type')"),
    ],
    ids=["100k-deep", "5000-digit-int", "a-list"],
)
def test_a_hostile_policy_config_is_one_line(
    content: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_engine_env: object
) -> None:
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text(content)
    flags = [a for a in TINY if not a.startswith("--policy.")]
    line = refused_in_process([*flags, f"--policy.path={policy}", f"--output_dir={tmp_path / 'out'}"], capsys)
    assert needle in line


def test_a_command_line_refused_at_start_up_never_imports_torch() -> None:
    """Start-up refusals are the common mistake; importing torch for them costs seconds of CPU each."""
    program = (
        "import sys\n"
        "from ckpt_tools.train.cli import main\n"
        "try:\n"
        f"    main([*{list(TINY)!r}, '--accelerator.mixed_precision=fp8', '--output_dir=unused'])\n"
        "except SystemExit as e:\n"
        "    print(e.code, 'torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=launch_env())
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr
    assert "choose no, bf16 or fp16" in proc.stderr
