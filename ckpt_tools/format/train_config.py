"""``train_config.json`` read as plain JSON: the fields a resume depends on, without draccus.

``--resume`` starts from this file and lets flags override it, so it - not
``training_step.json`` - decides the resumed run's parallelism, batch size, precision and save
format. The tools read it without the training extra installed; a field that is absent or of
the wrong type reads as None, and :func:`read_saved_config` only raises when the file is not
JSON at all.

Paths in it (:data:`PATH_FIELDS`) are recorded absolute by the trainer. A relative one (a
checkpoint of an older trainer) is read relative to where that run was launched, found from
the run dir the checkpoint is in - never from the current directory, which has nothing to do
with the checkpoint: :meth:`SavedConfig.resolve` is the one resolver.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_tools.format import layout
from ckpt_tools.format.ema import ema_enabled, schedule_from_config
from ckpt_tools.format.rules.startup import RunSettings
from ckpt_tools.io.remote import as_path, remote_file
from ckpt_tools.io.safe_read import read_json_file


def _get(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        data = data[part]
    data[last] = value


def _int(data: Any, dotted: str) -> int | None:
    value = _get(data, dotted)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(data: Any, dotted: str) -> float | None:
    value = _get(data, dotted)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _str(data: Any, dotted: str) -> str | None:
    value = _get(data, dotted)
    return value if isinstance(value, str) else None


def _floats(data: Any, dotted: str) -> list[float] | None:
    value = _get(data, dotted)
    if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return None
    return [float(v) for v in value]


def numbers(data: Any) -> list[tuple[str, object]]:
    """Every float of the config, and every list holding one, as (``--dotted.flag``, value).

    JSON reads ``NaN`` and ``Infinity`` as floats, and so does the trainer's flag parser:
    the start-up rules refuse them wherever they appear, without a list of fields to forget.
    Walked with an explicit stack: a hostile file nested as deep as ``json`` parses costs no
    recursion.
    """
    out: list[tuple[str, object]] = []
    if not isinstance(data, dict):
        return out
    stack: list[tuple[str, Iterator[tuple[Any, Any]]]] = [("", iter(data.items()))]
    while stack:
        prefix, items = stack[-1]
        item = next(items, None)
        if item is None:
            stack.pop()
            continue
        key, value = item
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            stack.append((dotted, iter(value.items())))
        elif isinstance(value, float) or (isinstance(value, list) and any(isinstance(v, float) for v in value)):
            out.append((f"--{dotted}", value))
    return out


# The top level of TrainConfig as the training core encodes it (a test keeps the two in step).
CONFIG_GROUPS = frozenset(
    {"dataset", "checkpoint", "optimizer", "scheduler", "parallelism", "accelerator", "trackio", "ema"}
)
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
        "overwrite_checkpoints",
        "progress_bar",
        "collective_timeout_s",
        "log_samples",
        "max_nonfinite_steps",
    }
)


# The fields that hold a local path (policy.path may be a Hub id instead).
PATH_FIELDS = ("output_dir", "dataset.root", "policy.path", "checkpoint.load_from")


def absolute_path(value: str) -> str:
    """A path the user typed (a flag: relative to the current directory), as the trainer records it."""
    return os.path.abspath(os.path.expanduser(value))


@dataclass(frozen=True)
class SavedConfig:
    """The resume-relevant part of a ``train_config.json`` (None: the file does not say)."""

    path: Path
    raw: dict[str, Any]

    @property
    def step(self) -> layout.StepPaths | None:
        """The checkpoint step this file is in (``<step>/pretrained_model/train_config.json``), if any."""
        if self.path.name != layout.TRAIN_CONFIG or self.path.parent.name != layout.PRETRAINED_MODEL_DIR:
            return None
        step = self.path.parent.parent
        return layout.StepPaths(step if remote_file(step) is not None else Path(os.path.abspath(step)))

    @property
    def run_dir(self) -> Path | None:
        """The run this checkpoint belongs to: where a resume of it writes by default.

        The directory holding its ``checkpoints/`` - a copy of a run is its own run, whatever
        ``output_dir`` its config recorded; for a step dir outside any ``checkpoints/``, the
        recorded ``output_dir``. None for a config file that is not in a checkpoint.
        """
        step = self.step
        if step is None:
            return None
        run = step.run_dir
        if run is not None:
            return run
        recorded = self.resolve("output_dir")
        return Path(recorded) if recorded else None

    def _anchor(self) -> Path | None:
        """Where the relative paths of this file are read from (None: not in a checkpoint).

        The run was launched from the directory that its recorded relative ``output_dir`` is
        relative to: the run dir with that ``output_dir`` taken off its end (``outputs/run``
        recorded, ``/home/u/repo/outputs/run`` on disk: ``/home/u/repo``). A run that was moved
        or copied no longer ends with it; its paths are then read relative to the run dir.
        """
        step = self.step
        if step is None:
            return None
        run = step.run_dir or step.root.parent
        recorded = _str(self.raw, "output_dir")
        if recorded and not os.path.isabs(os.path.expanduser(recorded)):
            tail = Path(os.path.normpath(recorded)).parts
            if tail == (".",):
                return run
            if ".." not in tail and len(tail) < len(run.parts) and run.parts[-len(tail) :] == tail:
                return Path(*run.parts[: -len(tail)])
        return run

    def resolve(self, dotted: str) -> str | None:
        """The path field ``dotted`` as an absolute path (a Hub id in ``policy.path`` stays as it is).

        For a file that is not in a checkpoint (``--config_path`` of a new run) a relative
        path stays relative: the trainer reads it from the current directory, as a flag.
        """
        value = _str(self.raw, dotted)
        anchor = self._anchor()
        if value is None or anchor is None:
            return value
        path = Path(value).expanduser()
        if path.is_absolute():
            return str(path)
        resolved = os.path.normpath(anchor / path)
        if dotted == "policy.path" and layout.is_hub_id(value) and not Path(resolved).exists():
            return value
        return resolved

    def resume_base(self) -> dict[str, Any]:
        """The config a resume of this checkpoint starts from: paths resolved, ``output_dir`` its run dir."""
        raw = json.loads(json.dumps(self.raw))  # a deep copy of plain JSON data
        for dotted in PATH_FIELDS:
            value = self.resolve(dotted)
            if value is not None and dotted != "output_dir":
                _set(raw, dotted, value)
        if self.run_dir is not None:
            raw["output_dir"] = str(self.run_dir)
        # The parts a run started from were loaded at its step 0; its resume continues its own state.
        if isinstance(raw.get("checkpoint"), dict):
            raw["checkpoint"] = {**raw["checkpoint"], "load_from": None, "load": None}
        return raw

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
        return self.resolve("policy.path")

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
            seed=_int(raw, "seed"),
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
            numbers=tuple(numbers(raw)),
            weight_decay=_float(raw, "optimizer.weight_decay"),
            betas=_floats(raw, "optimizer.betas"),
            eps=_float(raw, "optimizer.eps"),
            grad_clip_norm=_float(raw, "optimizer.grad_clip_norm"),
            warmup_steps=_int(raw, "scheduler.warmup_steps"),
            min_lr_ratio=_float(raw, "scheduler.min_lr_ratio"),
            dropout=_float(raw, "policy.dropout"),
            max_nonfinite_steps=_int(raw, "max_nonfinite_steps"),
            keep_last_n=self.keep_last_n,
            last_link=_str(raw, "checkpoint.last_link"),
            load_from=self.resolve("checkpoint.load_from"),
            load=_str(raw, "checkpoint.load"),
            resume=raw.get("resume") is True,
            ema_enable=ema_enabled(raw),
            ema_schedule=schedule_from_config(raw["ema"]) if isinstance(raw.get("ema"), dict) else None,
        )

    @property
    def keep_last_n(self) -> int | None:
        """``--checkpoint.keep_last_n`` of the run (None: keeps every checkpoint, or the file does not say)."""
        return _int(self.raw, "checkpoint.keep_last_n")

    @property
    def dataset_root(self) -> str | None:
        return self.resolve("dataset.root")

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
    p = as_path(path)
    data = read_json_file(p, missing="missing (--resume reads the training config from it)", want_object=True)
    return SavedConfig(p, data)
