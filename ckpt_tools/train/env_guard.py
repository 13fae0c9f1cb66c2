"""What the launcher left in the environment, checked before torch is imported.

- :func:`check_launcher_env`: a launcher that started processes without telling them their
  rank - ``accelerate launch --num_processes=N`` on a machine with fewer than two GPUs starts
  one plain process unless given ``--multi_gpu`` - is named, with the fix, instead of torch's
  ``RANK`` traceback.
- :func:`check_accelerate_env`: accelerate is only a launcher here; its engine-configuring
  variables are refused.


An ``accelerate config`` YAML configures the engine through environment variables, behind
the back of our own config, so ``train_config.json`` would no longer describe what ran. A
plain ``accelerate launch --num_processes=N`` sets some of the same variables to neutral
values (``ACCELERATE_MIXED_PRECISION=no``, ``ACCELERATE_DYNAMO_BACKEND=NO``, …); those are
not refused.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ckpt_tools.errors import ConfigError

# What torchrun (and accelerate's multi-process launchers) export to each process.
RANK_VARS = ("RANK", "WORLD_SIZE")


def env_rank(env: Mapping[str, str] | None = None) -> int:
    """The launcher's rank before any process group exists (0 for a plain run)."""
    return int((os.environ if env is None else env).get("RANK", "0"))


SHARED_STORE_OFF = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def check_restart_env(env: Mapping[str, str]) -> None:
    """Refuse ``torchrun --max-restarts=K`` while the workers share the agent's rendezvous store.

    torchrun (since torch 2.5) hands its workers its own TCP store, and a relaunch after a
    failure finds the previous launch's process-group keys in it: the relaunched workers
    connect to the dead workers' addresses and hang in ``init_process_group`` (gloo; NCCL
    fails alike, pytorch/pytorch#135712). The first launch would run, and every restart hang
    until the collective timeout. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, exported before
    torchrun, gives each launch a fresh store (rank 0 hosts it, as before torch 2.5).
    """
    restarts = env.get("TORCHELASTIC_MAX_RESTARTS", "0")
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and restarts.isdigit() and int(restarts) > 0:
        raise ConfigError(
            f"torchrun --max-restarts={restarts}: the relaunched workers would hang in init_process_group on the"
            f" rendezvous store torchrun shares with them (pytorch/pytorch#135712); export {SHARED_STORE_OFF}=1"
            " before torchrun"
        )


def check_launcher_env(env: Mapping[str, str]) -> None:
    """Refuse a process told where the rendezvous is (``MASTER_ADDR``) but not its rank or world size.

    That is what ``accelerate launch --num_processes=N`` (or ``--num_machines``) leaves when it
    starts a single process: it does so unless ``--multi_gpu`` is given or two GPUs are visible.
    torch would stop at ``RANK``; the N processes cannot be started from here, since accelerate
    does not pass N on.
    """
    if "MASTER_ADDR" not in env or all(name in env for name in RANK_VARS):
        return
    missing = " and ".join(name for name in RANK_VARS if name not in env)
    if "ACCELERATE_USE_CPU" in env:  # set by accelerate's single-process launcher, and only there
        raise ConfigError(
            f"accelerate launch started one process without {missing}: with fewer than 2 GPUs it starts"
            " --num_processes processes only when given --multi_gpu; add --multi_gpu"
            " (accelerate launch --multi_gpu --num_processes=N ...) or use torchrun --nproc-per-node=N"
        )
    raise ConfigError(
        f"MASTER_ADDR is set but {missing} not: start several processes with torchrun --nproc-per-node=N"
        " (or accelerate launch --multi_gpu --num_processes=N), or unset MASTER_ADDR for one process"
    )


ALLOW_VARS = ("LEROBOT_ALLOW_ACCELERATE_ENV", "CKPT_TOOLS_ALLOW_ACCELERATE_ENV")
_FALSY = {"", "0", "false", "no", "none"}
# Variables a plain launcher sets: refused only when they carry a non-neutral value.
_NEUTRAL = {
    "ACCELERATE_MIXED_PRECISION": {"no", ""},
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": {"1", ""},
    "ACCELERATE_DYNAMO_BACKEND": {"no", ""},
}
# Launcher bookkeeping that never configures the engine.
_IGNORED = {
    "ACCELERATE_USE_CPU",
    "ACCELERATE_DYNAMO_MODE",
    "ACCELERATE_DYNAMO_USE_DYNAMIC",
    "ACCELERATE_DYNAMO_USE_FULLGRAPH",
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION",
    "ACCELERATE_DEBUG_MODE",
    "ACCELERATE_LOG_LEVEL",
    "ACCELERATE_CONFIG_DS_FIELDS",
}
_PREFIXES = ("FSDP_", "PARALLELISM_CONFIG_", "ACCELERATE_DEEPSPEED_", "ACCELERATE_FSDP_")


def engine_variables(env: Mapping[str, str]) -> list[str]:
    """Names of the variables in ``env`` that would configure accelerate's engine."""
    found = []
    for name, value in env.items():
        if name in _IGNORED:
            continue
        if name in _NEUTRAL:
            if value.strip().lower() not in _NEUTRAL[name]:
                found.append(name)
        elif name.startswith("ACCELERATE_USE_"):
            if value.strip().lower() not in _FALSY:
                found.append(name)
        elif name.startswith(_PREFIXES):
            found.append(name)
    return sorted(found)


def check_accelerate_env(env: Mapping[str, str]) -> list[str]:
    """Raise if engine variables are set and not acknowledged; return them when acknowledged."""
    found = engine_variables(env)
    if not found:
        return []
    if any(env.get(v, "").strip().lower() not in _FALSY for v in ALLOW_VARS):
        return found
    shown = ", ".join(found[:6]) + (f" (+{len(found) - 6} more)" if len(found) > 6 else "")
    raise ConfigError(
        f"accelerate engine variables are set ({shown}): accelerate config files are not supported;"
        " put the settings in --parallelism.* / --accelerator.* flags, or set LEROBOT_ALLOW_ACCELERATE_ENV=1"
        " to acknowledge the override"
    )
