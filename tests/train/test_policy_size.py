"""A policy config is sized before anything is allocated: one line when it cannot be built or cannot fit.

A 2 KB config can ask for a terabyte; the trainer used to start building it and die in the
allocator (or the OOM killer) minutes into start-up. Now the parameters are counted from the
config - exactly: the count is held against the built policy here - and compared with the
memory this machine has.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ckpt_tools.errors import ConfigError
from ckpt_tools.train.policies.configs import ACTConfig, MLPConfig, TiedACTConfig
from ckpt_tools.train.policies.registry import make_policy
from ckpt_tools.train.policies.size import available_memory, estimate, require_fits
from devtools.training import TINY, train
from tests.train.test_train_startup import one_error_line, refused_in_process

HUGE = {"dim_model": 65536, "n_heads": 8, "dim_feedforward": 65536}  # ~94B parameters: about 1.4 TiB to train


@pytest.mark.parametrize(
    "config",
    [
        ACTConfig(state_dim=14, action_dim=7),
        ACTConfig(state_dim=3, action_dim=2, dim_model=48, n_heads=3, dim_feedforward=80, n_encoder_layers=3,
                  n_decoder_layers=2, n_obs_tokens=5, chunk_size=7),
        TiedACTConfig(state_dim=14, action_dim=7, dim_model=32, n_heads=2),
        MLPConfig(state_dim=14, action_dim=7),
        MLPConfig(state_dim=5, action_dim=3, hidden_dim=33, n_layers=0, chunk_size=4),
    ],
    ids=["act", "act-odd-sizes", "act-tied", "mlp", "mlp-no-blocks"],
)  # fmt: skip
def test_the_count_from_the_config_is_the_built_policys(config: object) -> None:
    found = estimate(config)  # type: ignore[arg-type]
    assert found is not None
    assert found.parameters == sum(p.numel() for p in make_policy(config).parameters())  # type: ignore[arg-type]


def test_a_policy_too_big_for_this_machine_is_refused_before_allocating() -> None:
    free = available_memory()
    assert free is not None  # /proc/meminfo on Linux
    config = ACTConfig(state_dim=14, action_dim=7, **HUGE)
    started = time.perf_counter()
    with pytest.raises(ConfigError) as refused:
        require_fits(config)
    assert time.perf_counter() - started < 1.0  # counted, not built
    message = str(refused.value)
    assert "\n" not in message and message.startswith("--policy.type=act: 94.50B parameters need about 1.4 TiB")
    assert "TiB (fp32 weights, gradients and AdamW state), but this machine has" in message and "available" in message
    # Sharding divides the gradients and optimizer state, not the whole-model build every process does.
    whole = estimate(config)
    sharded = estimate(config, shards=4)
    assert whole is not None and sharded is not None
    assert sharded.bytes_per_process == whole.parameters * 4 + -(-whole.parameters * 12 // 4)
    tiny = ACTConfig(state_dim=14, action_dim=7, dim_model=32, n_heads=2, dim_feedforward=64)
    assert require_fits(tiny, processes=4) is not None  # the test policy fits (no refusal)


@pytest.mark.parametrize(
    "flag, line",
    [
        ("--policy.n_heads=3", "--policy.n_heads=3 does not divide --policy.dim_model=32"),
        ("--policy.dim_feedforward=0", "--policy.dim_feedforward=0: must be a positive integer"),
        ("--policy.n_encoder_layers=-1", "--policy.n_encoder_layers=-1: must be an integer ≥ 0"),
        ("--policy.n_obs_tokens=null", "--policy.n_obs_tokens=None: must be a positive integer"),
    ],
)
def test_a_policy_that_cannot_be_built_is_refused_at_start_up(
    flag: str, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert refused_in_process([*TINY, flag, f"--output_dir={tmp_path / 'out'}"], capsys) == f"error: {line}"


def test_ckpt_train_refuses_a_terabyte_config_in_one_line(tmp_path: Path) -> None:
    """The trainer as launched: exit 2 and the one line, within seconds, nothing written."""
    flags = [
        a for a in TINY if not a.startswith(("--policy.dim_model", "--policy.n_heads", "--policy.dim_feedforward"))
    ]
    flags += [f"--policy.{k}={v}" for k, v in HUGE.items()]
    started = time.perf_counter()
    proc = train(*flags, "--steps=1", f"--output_dir={tmp_path / 'out'}", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "parameters need about" in one_error_line(proc) and time.perf_counter() - started < 60
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_a_step_whose_activations_cannot_fit_is_refused_with_what_to_shrink() -> None:
    """A long action chunk (attention grows with its square) or a huge batch: few parameters, terabytes in
    the first forward - which used to be a traceback from the allocator."""
    long_chunk = ACTConfig(state_dim=14, action_dim=7, dim_model=32, n_heads=2, dim_feedforward=64, chunk_size=200_000)
    with pytest.raises(ConfigError) as refused:
        require_fits(long_chunk, batch_size=8)
    message = str(refused.value)
    assert "of activations in one step" in message and "choose a smaller --batch_size or --policy.chunk_size" in message
    tiny = ACTConfig(state_dim=14, action_dim=7, dim_model=32, n_heads=2, dim_feedforward=64)
    with pytest.raises(ConfigError, match="activations dominate"):
        require_fits(tiny, batch_size=10**11)
    assert require_fits(tiny, batch_size=8) is not None  # the test runs fit
    # Without a batch (an accelerator run: activations live in device memory) they are not counted.
    assert estimate(long_chunk, on_host=False, batch_size=8).activations == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "flag, line",
    [
        ("--seed=99999999999999999999999", "--seed=99999999999999999999999: must lie within ±2**62"),
        ("--steps=10000000000000000000000", "--steps=10000000000000000000000: at most 1,000,000,000,000"),
    ],
)
def test_numbers_that_overflow_later_are_refused_at_start_up(
    flag: str, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert refused_in_process([*TINY, flag, f"--output_dir={tmp_path / 'out'}"], capsys).startswith(f"error: {line}")
