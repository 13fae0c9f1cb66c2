"""The values the start-up rules judge, each declared once with the flag it is read from.

A field of :class:`RunSettings` names its dotted flag and its kind (``setting("optimizer.lr",
Kind.FLOAT)``); :func:`read_run_settings` fills every such field from a config, whichever form
it has: the trainer's config dataclasses, or a ``train_config.json`` read as plain JSON by the
tools (no torch, no draccus). Both go through the same lookup and the same readers, so the
trainer and ``reshard-plan``/``verify-resume`` judge the same values the same way.

The readers are lenient: a value that is absent or of the wrong type reads as None, and the
rule it feeds is not checked (the trainer's config decoder refuses such a file on its own).
The few fields that are not one flag's value are computed by the functions :data:`DERIVED`
names, and nowhere else.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckpt_tools.format.ema import EmaSchedule, schedule_from_config


class Kind(enum.Enum):
    """How a flag's value is read; anything else reads as None."""

    INT = "int"  # an int, not a bool
    FLOAT = "float"  # an int or a float (not a bool), as a float
    STR = "str"
    BOOL = "bool"
    FLOATS = "floats"  # a list of numbers, as floats
    LIST = "list"  # a list of anything
    PATH = "path"  # a string naming a local path (resolved by the reader of a saved file)
    TRUE = "true"  # True when the value is True, else False (never None)


FLAG = "flag"  # the field metadata keys
KIND = "kind"


def setting(flag: str, kind: Kind, default: Any = None) -> Any:
    """A :class:`RunSettings` field read from the dotted ``flag`` as ``kind``."""
    return field(default=default, metadata={FLAG: flag, KIND: kind})


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_kind(kind: Kind, value: object) -> Any:
    """``value`` as ``kind`` says, or None (False for :attr:`Kind.TRUE`) when it is not of that kind."""
    if kind is Kind.INT:
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind is Kind.FLOAT:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if kind in (Kind.STR, Kind.PATH):
        return value if isinstance(value, str) else None
    if kind is Kind.BOOL:
        return value if isinstance(value, bool) else None
    if kind is Kind.TRUE:
        return value is True
    # The trainer's config holds tuples where train_config.json holds lists (betas).
    if not isinstance(value, (list, tuple)):
        return None
    if kind is Kind.LIST:
        return list(value)
    return [float(v) for v in value] if all(_is_number(v) for v in value) else None


@dataclass(frozen=True)
class RunSettings:
    """The values the start-up rules look at, as plain data.

    The trainer fills every field from its config. A tool reading ``train_config.json`` leaves
    None what the file does not say (or says with the wrong type): that rule is not checked,
    since the trainer's config decoder refuses such a file on its own.
    """

    steps: int | None = setting("steps", Kind.INT)
    seed: int | None = setting("seed", Kind.INT)
    batch_size: int | None = setting("batch_size", Kind.INT)
    save_freq: int | None = setting("save_freq", Kind.INT)
    log_freq: int | None = setting("log_freq", Kind.INT)
    collective_timeout_s: float | None = setting("collective_timeout_s", Kind.FLOAT)
    grad_accum_steps: int | None = setting("accelerator.gradient_accumulation.steps", Kind.INT)
    checkpoint_format: str | None = setting("checkpoint_format", Kind.STR)
    optimizer_type: str | None = setting("optimizer.type", Kind.STR)
    lr: float | None = setting("optimizer.lr", Kind.FLOAT)
    scheduler_type: str | None = setting("scheduler.type", Kind.STR)
    mixed_precision: str | None = setting("accelerator.mixed_precision", Kind.STR)
    wrap_modules: Sequence[str] | None = setting("accelerator.fsdp.wrap_modules", Kind.LIST)
    min_num_params: int | None = setting("accelerator.fsdp.min_num_params", Kind.INT)
    ignored_modules: str | None = setting("accelerator.fsdp.ignored_modules", Kind.STR)
    # FSDP2 MixedPrecisionPolicy: only the fields that are set (param_dtype, reduce_dtype, ...).
    mixed_precision_policy: Mapping[str, object] = field(default_factory=dict)
    peft: bool = False  # a peft group is present (any --peft.* flag)
    peft_method: str | None = setting("peft.method_type", Kind.STR)
    peft_r: int | None = setting("peft.r", Kind.INT)
    policy_path: str | None = setting("policy.path", Kind.PATH)  # None: no --policy.path (PEFT needs one)
    dp_replicate: int | None = setting("parallelism.dp_replicate", Kind.INT)
    dp_shard: int | None = setting("parallelism.dp_shard", Kind.INT)
    # Every float the config holds, and every list holding one, as (flag, value): each must be
    # finite - a NaN or infinite hyper-parameter passes every comparison and trains to NaN.
    numbers: tuple[tuple[str, object], ...] = ()
    weight_decay: float | None = setting("optimizer.weight_decay", Kind.FLOAT)
    betas: Sequence[float] | None = setting("optimizer.betas", Kind.FLOATS)
    eps: float | None = setting("optimizer.eps", Kind.FLOAT)
    grad_clip_norm: float | None = setting("optimizer.grad_clip_norm", Kind.FLOAT)
    warmup_steps: int | None = setting("scheduler.warmup_steps", Kind.INT)
    min_lr_ratio: float | None = setting("scheduler.min_lr_ratio", Kind.FLOAT)
    dropout: float | None = setting("policy.dropout", Kind.FLOAT)
    max_nonfinite_steps: int | None = setting("max_nonfinite_steps", Kind.INT)
    keep_last_n: int | None = setting("checkpoint.keep_last_n", Kind.INT)  # None: keep every checkpoint
    last_link: str | None = setting("checkpoint.last_link", Kind.STR)
    load_from: str | None = setting("checkpoint.load_from", Kind.PATH)  # a new run from a checkpoint's parts
    load: str | None = setting("checkpoint.load", Kind.STR)  # which parts (None: the model)
    resume: bool = setting("resume", Kind.TRUE, default=False)
    ema_enable: bool | None = setting("ema.enable", Kind.BOOL)  # None: the config does not say
    ema_schedule: EmaSchedule | None = None  # the other --ema.* flags


@functools.cache
def declared_flags() -> dict[str, tuple[str, Kind]]:
    """Each :class:`RunSettings` field read from a flag: field name -> (dotted flag, kind)."""
    return {f.name: (f.metadata[FLAG], f.metadata[KIND]) for f in dataclasses.fields(RunSettings) if FLAG in f.metadata}


# ---------------------------------------------------------------- a config of either form


def children(node: object) -> Iterator[tuple[str, Any]]:
    """The (name, value) pairs of a config group: a JSON object's items, or a dataclass's fields."""
    if isinstance(node, Mapping):
        yield from ((str(k), v) for k, v in node.items())
    elif dataclasses.is_dataclass(node) and not isinstance(node, type):
        yield from ((f.name, getattr(node, f.name)) for f in dataclasses.fields(node))


def is_group(value: object) -> bool:
    """A config group (a JSON object or a config dataclass), as opposed to a value."""
    return isinstance(value, Mapping) or (dataclasses.is_dataclass(value) and not isinstance(value, type))


def value_at(config: object, dotted: str) -> Any:
    """The value at ``dotted`` (``optimizer.lr``) of a config of either form; None where there is none."""
    node: Any = config
    for part in dotted.split("."):
        if isinstance(node, Mapping):
            node = node.get(part)
        elif is_group(node):
            node = dict(children(node)).get(part)
        else:
            return None
    return node


def numbers(config: object) -> list[tuple[str, object]]:
    """Every float of the config, and every list holding one, as (``--dotted.flag``, value).

    JSON reads ``NaN`` and ``Infinity`` as floats, and so does the trainer's flag parser:
    the start-up rules refuse them wherever they appear, without a list of fields to forget.
    Walked with an explicit stack: a hostile file nested as deep as ``json`` parses costs no
    recursion. A tuple (the trainer's betas) is listed as the list train_config.json saves.
    """
    out: list[tuple[str, object]] = []
    if not is_group(config):
        return out
    stack: list[tuple[str, Iterator[tuple[str, Any]]]] = [("", children(config))]
    while stack:
        prefix, items = stack[-1]
        item = next(items, None)
        if item is None:
            stack.pop()
            continue
        key, value = item
        dotted = f"{prefix}.{key}" if prefix else key
        if is_group(value):
            stack.append((dotted, children(value)))
        elif isinstance(value, float):
            out.append((f"--{dotted}", value))
        elif isinstance(value, (list, tuple)) and any(isinstance(v, float) for v in value):
            out.append((f"--{dotted}", list(value)))
    return out


def _mixed_precision_policy(config: object) -> dict[str, object]:
    return {k: v for k, v in children(value_at(config, "accelerator.fsdp.mixed_precision_policy")) if v is not None}


def _peft(config: object) -> bool:
    return is_group(value_at(config, "peft"))


def _numbers(config: object) -> tuple[tuple[str, object], ...]:
    return tuple(numbers(config))


def _ema_schedule(config: object) -> EmaSchedule | None:
    ema = value_at(config, "ema")
    return schedule_from_config(dict(children(ema))) if is_group(ema) else None


# The fields that are not one flag's value, and how each is computed from the whole config.
DERIVED: dict[str, Callable[[object], Any]] = {
    "mixed_precision_policy": _mixed_precision_policy,
    "peft": _peft,
    "numbers": _numbers,
    "ema_schedule": _ema_schedule,
}


def read_setting(config: object, name: str, resolve_path: Callable[[str], str | None] | None = None) -> Any:
    """The :class:`RunSettings` field ``name`` as ``config`` says it (see :func:`read_run_settings`)."""
    if name in DERIVED:
        return DERIVED[name](config)
    flag, kind = declared_flags()[name]
    raw = resolve_path(flag) if kind is Kind.PATH and resolve_path is not None else value_at(config, flag)
    return read_kind(kind, raw)


def read_run_settings(config: object, resolve_path: Callable[[str], str | None] | None = None) -> RunSettings:
    """What the start-up rules check, as ``config`` says it (None where it does not).

    ``config``: the trainer's config dataclasses, or a ``train_config.json``'s plain data.
    ``resolve_path``: how a :attr:`Kind.PATH` flag is read (a saved file's relative paths are
    relative to its run, :meth:`SavedConfig.resolve`); by default, the value as given.
    """
    names = [*declared_flags(), *DERIVED]
    return RunSettings(**{name: read_setting(config, name, resolve_path) for name in names})
