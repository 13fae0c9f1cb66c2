"""``--accelerator.fsdp.ignored_modules``: which modules FSDP leaves unsharded.

The flag is a regex over module paths (``encoder.layers.0``; with PEFT the live model's paths
start with ``base_model.model.``, ``peft_keys.PEFT_MODEL_PREFIX``). A module is ignored when
its whole path matches, and with it every parameter below it: the trainer keeps those
parameters whole on every rank, and ``reshard-plan`` counts them whole.
"""

from __future__ import annotations

import re


def pattern_problem(pattern: str | None) -> str | None:
    """Why ``pattern`` is not a regex (the ``re.error`` text), or None when it is one or is unset.

    A pattern nested too deeply or with a repeat count too large for ``re`` says so too, instead
    of a traceback: the saved config is user input to the tools.
    """
    if not pattern:
        return None
    try:
        re.compile(pattern)
    except RecursionError:
        return "nested too deeply"
    except (re.error, OverflowError) as e:
        return str(e)
    return None


def ignored_regex(pattern: str | None) -> re.Pattern[str] | None:
    """The compiled pattern; None when unset or not a regex (the start-up rules refuse the latter)."""
    if not pattern or pattern_problem(pattern) is not None:
        return None
    return re.compile(pattern)


def module_is_ignored(path: str, regex: re.Pattern[str] | None) -> bool:
    """Whether the module at ``path`` matches in full (the root, path ``""``, never does)."""
    return bool(path) and regex is not None and regex.fullmatch(path) is not None


def parameter_is_ignored(name: str, regex: re.Pattern[str] | None, prefix: str = "") -> bool:
    """Whether parameter ``prefix + name`` lives in an ignored module or below one."""
    modules = (prefix + name).split(".")[:-1]
    return any(module_is_ignored(".".join(modules[: i + 1]), regex) for i in range(len(modules)))
