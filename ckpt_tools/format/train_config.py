"""``train_config.json`` read as plain JSON: the fields a resume depends on, without draccus.

``--resume`` starts from this file and lets flags override it, so it - not
``training_step.json`` - decides the resumed run's parallelism, batch size, precision and save
format. The tools read it without the training extra installed; a field that is absent or of
the wrong type reads as None, and :func:`read_saved_config` only raises when the file is not
JSON at all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_tools.format.rules.startup import RunSettings
from ckpt_tools.io.safe_read import read_json_file


def _get(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def _int(data: Any, dotted: str) -> int | None:
    value = _get(data, dotted)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(data: Any, dotted: str) -> float | None:
    value = _get(data, dotted)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _str(data: Any, dotted: str) -> str | None:
    value = _get(data, dotted)
    return value if isinstance(value, str) else None


# The top level of TrainConfig as the training core encodes it (a test keeps the two in step).
CONFIG_GROUPS = frozenset({"dataset", "optimizer", "scheduler", "parallelism", "accelerator", "trackio"})
OPTIONAL_GROUPS = frozenset({"policy", "peft"})
CONFIG_SCALARS = frozenset(
    {
        "output_dir",
        "job_name",
        "seed",
        "steps",
        "batch_size",
        "save_freq",
        "save_checkpoint",
        "log_freq",
        "checkpoint_format",
        "checkpoint_async",
        "resume",
        "progress_bar",
        "collective_timeout_s",
        "log_samples",
    }
)


@dataclass(frozen=True)
class SavedConfig:
    """The resume-relevant part of a ``train_config.json`` (None: the file does not say)."""

    path: Path
    raw: dict[str, Any]

    @property
    def batch_size(self) -> int | None:
        return _int(self.raw, "batch_size")

    @property
    def steps(self) -> int | None:
        return _int(self.raw, "steps")

    @property
    def save_freq(self) -> int | None:
        return _int(self.raw, "save_freq")

    @property
    def grad_accum_steps(self) -> int | None:
        return _int(self.raw, "accelerator.gradient_accumulation.steps")

    @property
    def mixed_precision(self) -> str | None:
        return _str(self.raw, "accelerator.mixed_precision")

    @property
    def checkpoint_format(self) -> str | None:
        return _str(self.raw, "checkpoint_format")

    @property
    def dp_replicate(self) -> int | None:
        return _int(self.raw, "parallelism.dp_replicate")

    @property
    def dp_shard(self) -> int | None:
        return _int(self.raw, "parallelism.dp_shard")

    @property
    def lr(self) -> float | None:
        return _float(self.raw, "optimizer.lr")

    @property
    def policy_path(self) -> str | None:
        return _str(self.raw, "policy.path")

    @property
    def peft(self) -> bool:
        return isinstance(self.raw.get("peft"), dict)

    @property
    def peft_method(self) -> str | None:
        return _str(self.raw, "peft.method_type")

    @property
    def peft_r(self) -> int | None:
        return _int(self.raw, "peft.r")

    @property
    def policy_type(self) -> str | None:
        return _str(self.raw, "policy.type")

    @property
    def seed(self) -> int | None:
        return _int(self.raw, "seed")

    @property
    def license(self) -> str | None:
        """The license a model card states: the policy's, else a top-level one."""
        return _str(self.raw, "policy.license") or _str(self.raw, "license")

    @property
    def ignored_modules(self) -> str | None:
        return _str(self.raw, "accelerator.fsdp.ignored_modules")

    @property
    def mixed_precision_policy(self) -> dict[str, Any]:
        policy = _get(self.raw, "accelerator.fsdp.mixed_precision_policy")
        return {k: v for k, v in policy.items() if v is not None} if isinstance(policy, dict) else {}

    def run_settings(self) -> RunSettings:
        """What the start-up rules check, as this file says it (None where it does not)."""
        raw = self.raw
        wrap = _get(raw, "accelerator.fsdp.wrap_modules")
        return RunSettings(
            steps=self.steps,
            batch_size=self.batch_size,
            save_freq=self.save_freq,
            log_freq=_int(raw, "log_freq"),
            collective_timeout_s=_float(raw, "collective_timeout_s"),
            grad_accum_steps=self.grad_accum_steps,
            checkpoint_format=self.checkpoint_format,
            optimizer_type=_str(raw, "optimizer.type"),
            lr=self.lr,
            scheduler_type=_str(raw, "scheduler.type"),
            mixed_precision=self.mixed_precision,
            wrap_modules=wrap if isinstance(wrap, list) else None,
            min_num_params=_int(raw, "accelerator.fsdp.min_num_params"),
            ignored_modules=self.ignored_modules,
            mixed_precision_policy=self.mixed_precision_policy,
            peft=self.peft,
            peft_method=self.peft_method,
            peft_r=self.peft_r,
            policy_path=self.policy_path,
            dp_replicate=self.dp_replicate,
            dp_shard=self.dp_shard,
        )

    @property
    def dataset_root(self) -> str | None:
        return _str(self.raw, "dataset.root")

    @property
    def dataset_repo_id(self) -> str | None:
        return _str(self.raw, "dataset.repo_id")

    def shape_problems(self) -> list[str]:
        """What the training core's config decoder refuses outright: unknown fields, a group that is
        not an object, a scalar given as a list or object, a policy without a type.

        Values of the right shape but the wrong type ("8" for 8) are left to the decoder, which
        converts some of them; these are only the cases that can never start.
        """
        out = []
        for key, value in self.raw.items():
            group = key in CONFIG_GROUPS or (key in OPTIONAL_GROUPS and value is not None)
            if group and not isinstance(value, dict):
                out.append(f"{key} is {type(value).__name__}, not an object")
            elif key in CONFIG_SCALARS and isinstance(value, (list, dict)):
                out.append(f"{key} is {type(value).__name__}, not a value")
            elif key not in CONFIG_GROUPS | OPTIONAL_GROUPS | CONFIG_SCALARS:
                out.append(f"unknown field {key!r}")
        policy = self.raw.get("policy")
        if policy is None:
            out.append("no policy: the resume cannot rebuild the model")
        elif isinstance(policy, dict) and not isinstance(policy.get("type"), str):
            out.append("policy has no type")
        return out


def read_saved_config(path: str | os.PathLike[str]) -> SavedConfig:
    """Parse ``train_config.json``; :class:`CheckpointError` when it is missing or not a JSON object."""
    p = Path(path)
    data = read_json_file(p, missing="missing (--resume reads the training config from it)", want_object=True)
    return SavedConfig(p, data)
