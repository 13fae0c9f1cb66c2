"""``ckpt-train --help``: every flag, what it does, its choices and its default.

draccus's own usage page lists the dataclass fields with few descriptions, no choices and
mostly no defaults. LeRobot users look a flag up by its dotted name, so this page lists each
one once, grouped as the config is. Names, types, defaults and descriptions are read from the
config dataclasses (each field declares its text, :func:`ckpt_tools.train.flag.flag`) and the
choices from the start-up rules, so the page says what runs; a field without a text stops the
page (and a test holds every flag to one).
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_tools.format.rules import startup
from ckpt_tools.train.config import PeftConfig, TrainConfig
from ckpt_tools.train.flag import flag_help, shown_default
from ckpt_tools.train.policies.configs import PolicyConfig

USAGE = """\
usage: ckpt-train --dataset.root=DIR --policy.type=act --output_dir=DIR [--flag=value ...]
       torchrun --nproc-per-node=N $(which ckpt-train) ... [--parallelism.dp_shard=N ...]
       ckpt-train --resume=true --config_path=OUTPUT_DIR/checkpoints/last [--flag=value ...]
       TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --max-restarts=K ... $(which ckpt-train) --resume=auto ...
       ckpt-train ... --dry_run=true    # every check before the first step (dataset, policy, weights), then exit

Train a policy with DDP, FSDP2 or HSDP (one process, or launched by torchrun or accelerate
launch), in LeRobot's flag spelling: --group.field=value. pretrained_model/train_config.json
records exactly what ran; with --resume, flags given override it. docs/training.md has more.
"""

# The flags that are not a config field: what --help says of them, and their default in words.
# Every other flag's text is on its field (:func:`ckpt_tools.train.flag.flag`).
OTHER_FLAGS: dict[str, tuple[str, str]] = {
    "policy.type": (
        "The policy to build: act (a small ACT transformer), act_tied (ACT with its action head tied to an"
        " embedding), mlp (declares no FSDP wrap units).",
        "none (required unless --policy.path)",
    ),
    "config_path": (
        "With --resume=true: the checkpoint to resume (its train_config.json, pretrained_model/, step dir,"
        " `last`, checkpoints/ or run dir). Without: a train_config.json whose values the flags override."
        " With --resume=auto: the config of a new run (and the output dir, unless --output_dir is given); a"
        " found checkpoint resumes from its own train_config.json.",
        "none",
    ),
}

CHOICES: dict[str, Sequence[str]] = {
    "resume": ("true", "false", "auto"),
    "checkpoint_format": startup.CHECKPOINT_FORMATS,
    "checkpoint.last_link": startup.LAST_LINK_CHOICES,
    "policy.type": tuple(sorted(PolicyConfig.get_known_choices())),
    "optimizer.type": startup.OPTIMIZER_TYPES,
    "scheduler.type": startup.SCHEDULER_TYPES,
    "accelerator.mixed_precision": startup.MIXED_PRECISION_CHOICES,
    "peft.method_type": startup.PEFT_METHODS,
    **{
        f"accelerator.fsdp.mixed_precision_policy.{name}": startup.POLICY_DTYPES
        for name in ("param_dtype", "reduce_dtype", "output_dtype")
    },
}

GROUP_TITLES = {
    "": "Run",
    "dataset": "Dataset",
    "checkpoint": "Checkpoints kept, how `last` is written, and starting from another run's checkpoint",
    "policy": "Policy (fields marked [act, ...] exist on those policy types only)",
    "optimizer": "Optimizer",
    "scheduler": "Schedule",
    "parallelism": "Layout (DDP, FSDP2, HSDP)",
    "accelerator": "Accelerator",
    "peft": "PEFT (LoRA); off unless a --peft.* flag is given",
    "trackio": "Tracking",
    "ema": "EMA of the weights (LeRobot's --ema.* flags)",
}


@dataclass(frozen=True)
class Flag:
    """One dotted flag of the config, as the help page shows it."""

    name: str  # dotted, without the leading --
    metavar: str
    default: str
    help: str
    choices: tuple[str, ...] = ()
    policy_types: tuple[str, ...] = ()  # policy.* fields only: the types that have it (empty: all)

    @property
    def group(self) -> str:
        return self.name.split(".", 1)[0] if "." in self.name else ""


@dataclass(frozen=True)
class _Leaf:
    """A non-group field of the config: its dotted name, type and default, and the field itself."""

    name: str
    type: Any
    default: Any
    field: dataclasses.Field[Any] | None = None  # None: ``policy`` and ``peft``, listed by their own fields


def config_flags() -> list[Flag]:
    """Every leaf flag of :class:`TrainConfig`, in declaration order, plus ``--config_path``."""
    flags: list[Flag] = []
    for leaf in _leaves(TrainConfig, TrainConfig(), ""):
        if leaf.name == "policy":
            flags.extend(_policy_flags())
        elif leaf.name == "peft":
            flags.extend(_flag(peft) for peft in _leaves(PeftConfig, PeftConfig(), "peft."))
        else:
            flags.append(_flag(leaf))
    flags.append(_other_flag("config_path"))
    return flags


def _leaves(cls: Any, instance: Any, prefix: str) -> list[_Leaf]:
    """Each non-dataclass field, dotted; ``policy`` and ``peft`` as themselves."""
    out: list[_Leaf] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, value = hints[f.name], getattr(instance, f.name)
        if _optional_dataclass(tp) in (PolicyConfig, PeftConfig):
            out.append(_Leaf(f"{prefix}{f.name}", tp, None))
        elif dataclasses.is_dataclass(value):
            out.extend(_leaves(type(value), value, f"{prefix}{f.name}."))
        else:
            out.append(_Leaf(f"{prefix}{f.name}", tp, value, f))
    return out


def _optional_dataclass(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next((a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)), None)
    return None


def _policy_flags() -> list[Flag]:
    """``--policy.type`` and the union of the registered policy types' fields (which types have each)."""
    choices = PolicyConfig.get_known_choices()
    seen: dict[str, dict[str, _Leaf]] = {}
    for type_name, cls in choices.items():
        for leaf in _leaves(cls, cls(), "policy."):
            seen.setdefault(leaf.name, {})[type_name] = leaf
    flags = [_other_flag("policy.type")]
    for by_type in seen.values():
        first = next(iter(by_type.values()))  # a field the types inherit: one declaration, one text
        defaults = {type_name: _show(leaf.default) for type_name, leaf in by_type.items()}
        shown = next(iter(defaults.values())) if len(set(defaults.values())) == 1 else _per_type(defaults)
        owners = () if len(by_type) == len(choices) else tuple(sorted(by_type))
        flag = _flag(first)
        own_default = first.field is not None and shown_default(first.field) is not None
        flags.append(dataclasses.replace(flag, default=flag.default if own_default else shown, policy_types=owners))
    return flags


def _per_type(defaults: dict[str, str]) -> str:
    return ", ".join(f"{value} ({type_name})" for type_name, value in sorted(defaults.items()))


def _flag(leaf: _Leaf) -> Flag:
    """The flag of a config field: its text and (unless it words its own) its default are the field's."""
    assert leaf.field is not None, leaf.name
    text = flag_help(leaf.field)
    if text is None:
        raise RuntimeError(f"--{leaf.name} has no --help text: declare its field with ckpt_tools.train.flag.flag")
    choices = tuple(CHOICES.get(leaf.name, ()))
    default = shown_default(leaf.field) or _show(leaf.default)
    return Flag(leaf.name, _metavar(leaf.type, choices), default, text, choices)


def _other_flag(name: str) -> Flag:
    text, default = OTHER_FLAGS[name]
    choices = tuple(CHOICES.get(name, ()))
    return Flag(name, _metavar(str, choices), default, text, choices)


def _metavar(tp: Any, choices: tuple[str, ...]) -> str:
    if choices:
        return "{" + ",".join(choices) + "}"
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    inner = args[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1 else tp
    origin = typing.get_origin(inner)
    if inner is bool:
        return "{true,false}"
    if inner is int:
        return "INT"
    if inner is float:
        return "FLOAT"
    if origin in (list, tuple):
        item = typing.get_args(inner)[0]
        return '["NAME",...]' if item is str else "[X,Y]"
    return "TEXT"


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return json.dumps(list(value))
    return str(value)


def render_help(width: int = 100) -> str:
    """The whole page, grouped as the config is."""
    lines = [USAGE]
    flags = config_flags()
    for group, title in GROUP_TITLES.items():
        members = [f for f in flags if f.group == group]
        if not members:
            continue
        lines.append(f"{title}:")
        for flag in members:
            owners = f" [{', '.join(flag.policy_types)}]" if flag.policy_types else ""
            lines.append(f"  --{flag.name}={flag.metavar}{owners}")
            text = flag.help
            if flag.choices and not flag.metavar.startswith("{"):
                text += f" Choices: {', '.join(flag.choices)}."
            text += f" Default: {flag.default}."
            lines.extend(textwrap.wrap(text, width, initial_indent="      ", subsequent_indent="      "))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


__all__ = ["Flag", "config_flags", "render_help"]
