"""A training flag's declaration: its config field, with the text ``ckpt-train --help`` shows for it.

The help page (:mod:`ckpt_tools.train.help`) reads names, types and defaults from the config
dataclasses and the description from each field's metadata, so a flag is declared in one place:
``lr: float = flag(1e-4, help="Learning rate ...")``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

HELP = "help"  # field metadata: what the flag does, in the trainer's terms (one line or two)
SHOWN_DEFAULT = "shown_default"  # field metadata: the default in words, where the plain value would mislead


def flag(default: Any = None, *, help: str, shown_default: str | None = None) -> Any:
    """A config field of a plain default, with its ``--help`` text."""
    metadata = {HELP: help} if shown_default is None else {HELP: help, SHOWN_DEFAULT: shown_default}
    return dataclasses.field(default=default, metadata=metadata)


def flag_help(f: dataclasses.Field[Any]) -> str | None:
    """The ``--help`` text of a config field (None: it declares none)."""
    text = f.metadata.get(HELP)
    return text if isinstance(text, str) else None


def shown_default(f: dataclasses.Field[Any]) -> str | None:
    """The default as ``--help`` words it, where the field says (None: its plain value)."""
    text = f.metadata.get(SHOWN_DEFAULT)
    return text if isinstance(text, str) else None
