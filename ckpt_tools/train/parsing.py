"""Dotted flags → :class:`TrainConfig`, with one-line errors naming the flag.

draccus does the decoding; this module adds what a training launcher needs around it:
flag names checked up front (draccus would print a page of usage), ``--policy.path`` and
``--config_path`` / ``--resume`` turned into a base config that the command-line flags then
override.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import json
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

import draccus

from ckpt_tools.errors import CheckpointError, ConfigError
from ckpt_tools.format import layout
from ckpt_tools.format.policy_path import adapter_refusal
from ckpt_tools.format.rules.resume_output import auto_resume
from ckpt_tools.format.train_config import absolute_path, read_saved_config
from ckpt_tools.hub.location import is_hub_path
from ckpt_tools.io.safe_read import read_json_file
from ckpt_tools.train.config import TrainConfig
from ckpt_tools.train.policies.configs import PolicyConfig

PASS_THROUGH = {"help", "h"}
AUTO = "auto"  # --resume=auto: resume the output dir's `last` when there is one, else start a new run


def _dataclass_of(tp: Any) -> Any:
    """The dataclass inside ``X | None`` annotations (None if there is none)."""
    if dataclasses.is_dataclass(tp):
        return tp
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if dataclasses.is_dataclass(arg):
                return arg
    return None


def flag_names(cls: Any = TrainConfig, prefix: str = "") -> set[str]:
    """Every dotted flag a dataclass tree accepts (policy: the union over registered types)."""
    names: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        names.add(name)
        inner = _dataclass_of(hints[f.name])
        if inner is PolicyConfig:
            names.add(f"{name}.type")
            for choice in PolicyConfig.get_known_choices().values():
                names |= flag_names(choice, f"{name}.")
        elif inner is not None:
            names |= flag_names(inner, f"{name}.")
    return names


def _split(arg: str) -> tuple[str, str | None]:
    body = arg[2:]
    name, eq, value = body.partition("=")
    return name, (value if eq else None)


def _check_names(args: list[str]) -> None:
    valid = flag_names() | {"config_path"}
    for arg in args:
        if not arg.startswith("--"):
            continue
        name, value = _split(arg)
        if name in PASS_THROUGH:
            continue
        if name not in valid:
            close = difflib.get_close_matches(name, sorted(valid), n=1)
            hint = f" (did you mean --{close[0]}?)" if close else ""
            raise ConfigError(f"unknown flag --{name}{hint}")
        if name == "policy.type" and value is not None and value not in PolicyConfig.get_known_choices():
            choices = ", ".join(sorted(PolicyConfig.get_known_choices()))
            raise ConfigError(f"--policy.type={value}: unknown policy type (choose {choices})")
    _check_policy_fields(args)


def _check_policy_fields(args: list[str]) -> None:
    """``--policy.<field>`` must exist on the chosen policy type (draccus's error would not say so)."""
    policy_type = _peek(args, "policy.type")
    choice = PolicyConfig.get_known_choices().get(policy_type) if policy_type else None
    if choice is None:
        return
    fields = {f.name for f in dataclasses.fields(choice)} | {"type"}
    for arg in args:
        name = _split(arg)[0] if arg.startswith("--policy.") else ""
        if name and name.removeprefix("policy.") not in fields:
            raise ConfigError(f"--{name}: the {policy_type} policy has no such field ({', '.join(sorted(fields))})")


def _pop(args: list[str], name: str) -> str | None:
    """Remove ``--name=value`` (or ``--name value``) from args and return the value."""
    for i, arg in enumerate(args):
        if arg == f"--{name}" and i + 1 < len(args):
            value = args[i + 1]
            del args[i : i + 2]
            return value
        if arg.startswith(f"--{name}="):
            del args[i]
            return arg.split("=", 1)[1]
    return None


def _peek(args: list[str], name: str) -> str | None:
    """The value of the last ``--name`` (the one argparse keeps), without removing it."""
    found = None
    rest = list(args)
    while (value := _pop(rest, name)) is not None:
        found = value
    return found


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


def _draccus_parse(args: list[str], base: dict[str, Any] | None) -> TrainConfig:
    stderr = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp:
        config_path = None
        if base is not None:
            config_path = Path(tmp) / "base.json"
            config_path.write_text(json.dumps(base))
        try:
            with contextlib.redirect_stderr(stderr):
                cfg = draccus.parse(TrainConfig, config_path=config_path, args=args)
        except SystemExit as e:
            if e.code == 0:  # --help
                raise
            lines = [ln for ln in stderr.getvalue().splitlines() if "error:" in ln]
            raise ConfigError(lines[-1].split("error:", 1)[1].strip() if lines else "invalid arguments") from None
        except Exception as e:  # draccus.utils.DecodingError and friends: name the flag
            raise ConfigError(_decoding_message(e)) from None
    assert isinstance(cfg, TrainConfig)
    return cfg


def _decoding_message(error: Exception) -> str:
    """draccus's error as one line: its first line, and the reasons it lists below it (what did not decode)."""
    lines = [ln.strip() for ln in str(error).strip().splitlines() if ln.strip()]
    text = " ".join(lines) if lines else type(error).__name__
    if text.startswith("`"):
        path, _, rest = text[1:].partition("`")
        return f"--{path}: {rest.lstrip(': ').strip()}"
    return text


@dataclasses.dataclass(frozen=True)
class ParsedArgs:
    """What the command line asks for: the config, the step dir to resume from, what to say first."""

    cfg: TrainConfig
    resume_from: Path | None
    notes: tuple[str, ...] = ()  # defaults chosen from other flags, said at start-up


def parse_train_config(argv: list[str]) -> tuple[TrainConfig, Path | None]:
    """(config, step dir to resume from or None), every default filled in."""
    parsed = parse_train_args(argv)
    return parsed.cfg, parsed.resume_from


def resume_config(step: layout.StepPaths, args: list[str]) -> TrainConfig:
    """The config a resume of ``step`` runs with: its ``train_config.json`` under the command's ``args``.

    Torch-free: ``verify-resume`` builds it with the same call (its ``config-builds`` check).
    Read as the tools read it: paths resolved, ``output_dir`` the run the checkpoint is in.
    """
    base = read_saved_config(step.train_config).resume_base()
    base["overwrite_checkpoints"] = False  # only this launch's own flag replaces checkpoints
    cfg = _draccus_parse([a for a in args if not a.startswith("--policy.type")], base)
    cfg.resume = True
    cfg.record_absolute_paths()
    return cfg


def parse_train_args(argv: list[str]) -> ParsedArgs:
    """The command line as :class:`ParsedArgs`; a bad flag raises :class:`ConfigError` naming it."""
    notes: list[str] = []
    cfg, resume_from = _parse(argv, notes)
    return ParsedArgs(cfg, resume_from, tuple(notes + cfg.fill_defaults()))


def _parse(argv: list[str], notes: list[str]) -> tuple[TrainConfig, Path | None]:
    args = list(argv)
    _check_names(args)
    config_path = _pop(args, "config_path")
    resume = _truthy(_peek(args, "resume"))
    if _is_auto(_peek(args, "resume")):
        while _pop(args, "resume") is not None:  # the decision replaces the flag
            pass
        step_dir = _auto_resume(args, config_path, notes)
        resume = step_dir is not None
        if resume:  # a relaunch continues the run's own state, not the parts it started from
            for name in ("checkpoint.load_from", "checkpoint.load"):
                while _pop(args, name) is not None:
                    pass
        config_path = str(step_dir) if step_dir is not None else config_path
    if resume:
        if config_path is None:
            raise ConfigError(
                "--resume=true needs --config_path=.../checkpoints/last/pretrained_model/train_config.json"
            )
        if is_hub_path(config_path):
            config_path = str(_fetched_step(config_path, args))
        try:
            step = layout.resolve_step(config_path)  # `last` → the step it points at, as the tools read it
        except CheckpointError as e:
            raise CheckpointError(f"--config_path={e}") from None
        from ckpt_tools.train.checkpoint.parts import load_training_step

        # A checkpoint this trainer never resumes (LeRobot's, the 0.6.x layout) is named as such
        # before its train_config.json is decoded: a LeRobot config would only fail as unknown fields.
        load_training_step(step)
        return resume_config(step, args), step.root.resolve()
    base = _read_config(Path(config_path)) if config_path else None
    policy_path = _pop(args, "policy.path")
    if policy_path is not None:
        base = _with_pretrained_policy(base or {}, policy_path, _peek(args, "policy.type"))
        published = base["policy"].pop("repo_id", None)
        base["policy"].pop("private", None)
        if published and _peek(args, "policy.repo_id") is None:
            notes.append(_not_republished(policy_path, published))
        args = [a for a in args if not a.startswith("--policy.type")]
    load_from = _peek(args, "checkpoint.load_from")
    if load_from is not None and policy_path is None and _peek(args, "policy.type") is None:
        base = _with_source_policy(base or {}, load_from)
    cfg = _draccus_parse(args, base)
    cfg.record_absolute_paths()
    return cfg, None


def _fetched_step(config_path: str, args: list[str]) -> Path:
    """``--config_path=hf://...``: the step it names, downloaded and verified (:mod:`ckpt_tools.hub.fetch_step`)."""
    if _peek(args, "output_dir") is None:
        raise ConfigError(
            f"--config_path={config_path}: name the local --output_dir the resumed run writes into"
            " (a checkpoint on the Hub is never written to)"
        )
    from ckpt_tools.hub.fetch_step import fetch_step

    return fetch_step(config_path)


def _is_auto(value: str | None) -> bool:
    return value is not None and value.strip().lower() == AUTO


def _auto_resume(args: list[str], config_path: str | None, notes: list[str]) -> Path | None:
    """``--resume=auto``: the checkpoint to resume (then read exactly as ``--resume=true`` reads it), or None.

    The output dir is ``--output_dir``, else the one ``--config_path``'s file names (a job
    script's config for a new run). With a checkpoint there, the resume is built from that
    checkpoint's ``train_config.json`` - what the run that wrote it ran with - and the flags
    given, as with ``--resume=true``; ``--config_path``'s file only serves a new run.
    """
    output_dir = _peek(args, "output_dir")
    if output_dir is None and config_path is not None:
        named = _read_config(Path(config_path)).get("output_dir")
        output_dir = named if isinstance(named, str) and named else None
    if output_dir is None:
        raise ConfigError("--resume=auto needs --output_dir: the run it resumes, or starts when it has no checkpoint")
    decision = auto_resume(Path(absolute_path(output_dir)))
    if decision.refusal is not None:
        raise ConfigError(decision.refusal)
    line = decision.line
    if decision.step_dir is not None and config_path is not None:
        line += f" (its train_config.json and the flags given, not --config_path={config_path}, set the run)"
    notes.append(line)
    return decision.step_dir


def _with_pretrained_policy(base: dict[str, Any], policy_path: str, cli_type: str | None) -> dict[str, Any]:
    from ckpt_tools.train.pretrained import resolve_policy_dir, saved_policy_config

    directory = resolve_policy_dir(policy_path)
    refusal = adapter_refusal(policy_path, directory)
    if refusal is not None:  # before the model is built: an adapter alone leaves nothing to train
        raise ConfigError(refusal)
    saved = saved_policy_config(directory)
    foreign = _lerobot_policy_problem(saved, policy_path)
    if foreign is not None:
        raise ConfigError(foreign)
    if cli_type is not None and cli_type != saved.get("type"):
        raise ConfigError(
            f"--policy.type={cli_type} contradicts --policy.path={policy_path} (a {saved.get('type')} policy)"
        )
    saved["path"] = str(directory) if Path(policy_path).exists() else policy_path
    return {**base, "policy": saved}


def _with_source_policy(base: dict[str, Any], load_from: str) -> dict[str, Any]:
    """``--checkpoint.load_from`` without a policy flag: the policy its checkpoint holds, built as it was saved.

    Read as ``--policy.path`` reads a saved policy, but without the path: the weights come from
    the parts the load chooses (:mod:`ckpt_tools.format.rules.load_parts`), not from here.
    """
    try:
        step = layout.resolve_step(load_from)
    except CheckpointError as e:
        raise CheckpointError(f"--checkpoint.load_from={e}") from None
    if isinstance(base.get("policy"), dict):
        return base  # --config_path names the policy
    from ckpt_tools.facts import load_parts as load_sources
    from ckpt_tools.facts.record import read_record
    from ckpt_tools.format.rules import load_parts

    record = read_record(step)
    if record.peft:  # its pretrained_model/ holds an adapter: the line says what to pass instead
        raise CheckpointError(load_sources.source_refusal(step, record, load_parts.DEFAULT, fp16=False) or "")
    policy: dict[str, Any] = read_json_file(
        step.policy_config, label=f"--checkpoint.load_from={step.policy_config}", want_object=True
    )
    foreign = _lerobot_policy_problem(policy, str(step.pretrained_model))
    if foreign is not None or not isinstance(policy.get("type"), str):
        raise ConfigError(foreign or f"--checkpoint.load_from={step.policy_config}: not a policy config (no 'type')")
    for field_name in ("path", "repo_id", "private"):
        policy.pop(field_name, None)
    return {**base, "policy": policy}


def _not_republished(policy_path: str, repo_id: str) -> str:
    """Why the saved policy's ``repo_id`` is dropped: publishing is this run's own choice.

    A saved policy records the repo its run was to publish to (whether that push happened, or
    succeeded, the config cannot say). Carried over, a fine-tune or a LoRA run on it would push
    its own result over that repo at the end - replacing the base policy others download -
    without the user having asked to publish at all.
    """
    return (
        f"--policy.path={policy_path} records policy.repo_id={repo_id} (where its run was to publish):"
        " this run does not publish there (pass --policy.repo_id to publish it)"
    )


def _lerobot_policy_problem(saved: dict[str, Any], policy_path: str) -> str | None:
    """Why a saved LeRobot policy cannot start a ckpt-train run (None: it is not one of LeRobot's).

    LeRobot's policies are not ckpt-train's, even under the same name: LeRobot's ``act`` has a VAE
    encoder and per-feature input projections (``input_features``, ``output_features``), so
    neither its config nor its weights fit ckpt-train's ``act``. The message names the fields
    ckpt-train's policy of that type does not have.
    """
    from ckpt_tools.format import lerobot

    if not lerobot.policy_fields(saved) or len(lerobot.policy_fields(saved)) < len(lerobot.POLICY_MARKERS):
        return None
    policy_type = saved.get("type")
    choice = PolicyConfig.get_known_choices().get(policy_type) if isinstance(policy_type, str) else None
    if choice is not None:
        ours = {f.name for f in dataclasses.fields(choice)} | {"type"}
        unknown = [name for name in saved if name not in ours]
        shown = ", ".join(unknown[:6]) + (f" and {len(unknown) - 6} more" if len(unknown) > 6 else "")
        what = f"fields ckpt-train's {policy_type} policy does not have: {shown}"
    else:
        what = f"a policy type ckpt-train does not have ({', '.join(sorted(PolicyConfig.get_known_choices()))})"
    return (
        f"--policy.path={policy_path}: a LeRobot {policy_type} policy (its config.json has {what}): ckpt-train"
        " builds only its own policies, whose weights a LeRobot policy does not fit; fine-tune it with LeRobot:"
        f" lerobot-train --policy.path={policy_path}"
    )


def _read_config(path: Path) -> dict[str, Any]:
    """``--config_path``'s JSON object; every way it can be bad is a start-up refusal naming the flag."""
    data: dict[str, Any] = read_json_file(
        path, label=f"--config_path={path}", missing="no such file", want_object=True, error=ConfigError
    )
    return data


__all__ = ["ParsedArgs", "flag_names", "parse_train_args", "parse_train_config"]
