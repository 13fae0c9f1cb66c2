"""Refuse accelerate's engine-configuring environment variables: accelerate is only a launcher here.

An ``accelerate config`` YAML configures the engine through environment variables, behind
the back of our own config, so ``train_config.json`` would no longer describe what ran. A
plain ``accelerate launch --num_processes=N`` sets some of the same variables to neutral
values (``ACCELERATE_MIXED_PRECISION=no``, ``ACCELERATE_DYNAMO_BACKEND=NO``, …); those are
not refused.
"""

from __future__ import annotations

from collections.abc import Mapping

from ckpt_tools.errors import ConfigError

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
