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

import dataclasses
import json
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_tools.format import layout
from ckpt_tools.format.rules.run_settings import (
    Kind,
    RunSettings,
    is_group,
    read_kind,
    read_run_settings,
    read_setting,
    value_at,
)
from ckpt_tools.io.remote import as_path, remote_file
from ckpt_tools.io.safe_read import read_json_file


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        data = data[part]
    data[last] = value


def _str(data: Any, dotted: str) -> str | None:
    value = read_kind(Kind.STR, value_at(data, dotted))
    return value if isinstance(value, str) else None


# The top level of train_config.json: what the tools accept there without draccus. The training
# core's TrainConfig is checked against these when it is imported (:func:`top_level_mismatch`),
# so a field added there and not here stops every trainer start and every test that imports it.
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


def top_level_mismatch(config_class: type) -> str | None:
    """How the top-level fields of the trainer's config dataclass differ from the lists above (None: they agree).

    A field whose default is a config group is a group, one typed as an optional config
    dataclass (policy, peft: None until given) an optional group, any other a scalar.
    """
    groups, optional, scalars = set(), set(), set()
    hints = typing.get_type_hints(config_class)
    for f in dataclasses.fields(config_class):
        if f.default_factory is not dataclasses.MISSING and is_group(f.default_factory()):
            groups.add(f.name)
        elif any(dataclasses.is_dataclass(member) for member in typing.get_args(hints[f.name])):
            optional.add(f.name)
        else:
            scalars.add(f.name)
    declared = {"CONFIG_GROUPS": CONFIG_GROUPS, "OPTIONAL_GROUPS": OPTIONAL_GROUPS, "CONFIG_SCALARS": CONFIG_SCALARS}
    found = {"CONFIG_GROUPS": groups, "OPTIONAL_GROUPS": optional, "CONFIG_SCALARS": scalars}
    problems = [
        f"{name} lacks {sorted(found[name] - declared[name])} and lists {sorted(declared[name] - found[name])}"
        for name in declared
        if found[name] != declared[name]
    ]
    if not problems:
        return None
    return f"{config_class.__name__} and ckpt_tools/format/train_config.py disagree: " + "; ".join(problems)


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

    def run_settings(self) -> RunSettings:
        """What the start-up rules check, as this file says it (None where it does not).

        Read by :func:`read_run_settings`, as the trainer reads its own config; the properties
        below read one of its fields each, by the same declaration.
        """
        return read_run_settings(self.raw, resolve_path=self.resolve)

    def _setting(self, name: str) -> Any:
        return read_setting(self.raw, name, resolve_path=self.resolve)

    @property
    def batch_size(self) -> int | None:
        return self._setting("batch_size")

    @property
    def steps(self) -> int | None:
        return self._setting("steps")

    @property
    def save_freq(self) -> int | None:
        return self._setting("save_freq")

    @property
    def grad_accum_steps(self) -> int | None:
        return self._setting("grad_accum_steps")

    @property
    def mixed_precision(self) -> str | None:
        return self._setting("mixed_precision")

    @property
    def checkpoint_format(self) -> str | None:
        return self._setting("checkpoint_format")

    @property
    def dp_replicate(self) -> int | None:
        return self._setting("dp_replicate")

    @property
    def dp_shard(self) -> int | None:
        return self._setting("dp_shard")

    @property
    def lr(self) -> float | None:
        return self._setting("lr")

    @property
    def policy_path(self) -> str | None:
        return self._setting("policy_path")

    @property
    def peft(self) -> bool:
        return self._setting("peft")

    @property
    def peft_method(self) -> str | None:
        return self._setting("peft_method")

    @property
    def peft_r(self) -> int | None:
        return self._setting("peft_r")

    @property
    def seed(self) -> int | None:
        return self._setting("seed")

    @property
    def ignored_modules(self) -> str | None:
        return self._setting("ignored_modules")

    @property
    def mixed_precision_policy(self) -> dict[str, Any]:
        return self._setting("mixed_precision_policy")

    @property
    def keep_last_n(self) -> int | None:
        """``--checkpoint.keep_last_n`` of the run (None: keeps every checkpoint, or the file does not say)."""
        return self._setting("keep_last_n")

    @property
    def policy_type(self) -> str | None:
        return _str(self.raw, "policy.type")

    @property
    def license(self) -> str | None:
        """The license a model card states: the policy's, else a top-level one."""
        return _str(self.raw, "policy.license") or _str(self.raw, "license")

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
