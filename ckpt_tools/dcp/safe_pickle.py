"""A pickle loader that can only build what we allow: the base of every checkpoint read.

``pickle.load`` runs whatever callable a file names, so a hostile ``.metadata`` could
execute code on the machine of whoever inspects it. Here every global goes through an
allowlist that maps a (module, name) pair to a harmless stand-in of our own; anything else
stops the load with :class:`UnsafeCheckpoint` naming the refused global. Persistent ids
(torch.save's storage references) are refused unless the caller handles them.

Bombs: the input is size-capped before parsing, so neither the memo nor any object can grow
beyond a small multiple of that cap, and only allowlisted callables are ever REDUCEd.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Mapping
from typing import Any

from ckpt_tools.errors import CorruptCheckpoint, UnsafeCheckpoint

Allowlist = Mapping[tuple[str, str], Any]

# Exceptions a malformed (not hostile) pickle raises while being parsed or while our
# stand-ins reject their arguments.
_MALFORMED = (
    pickle.UnpicklingError,
    EOFError,
    TypeError,
    ValueError,
    AttributeError,
    IndexError,
    KeyError,
    OverflowError,
    MemoryError,
    RecursionError,
    UnicodeDecodeError,
)


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(
        self,
        file: io.BytesIO,
        allowed: Allowlist,
        what: str,
        persistent_load: Callable[[Any], Any] | None,
    ) -> None:
        super().__init__(file)
        self._allowed = allowed
        self._what = what
        self._persistent = persistent_load

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except (KeyError, TypeError):
            raise UnsafeCheckpoint(
                f"{self._what}: refused to load global {module}.{name} (checkpoint pickles may only hold data)"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise UnsafeCheckpoint(f"{self._what}: refused a persistent reference (not expected in this file)")
        return self._persistent(pid)


def restricted_loads(
    data: bytes | memoryview,
    allowed: Allowlist,
    *,
    what: str,
    persistent_load: Callable[[Any], Any] | None = None,
) -> Any:
    """Unpickle ``data`` with only ``allowed`` globals; one clear error for anything else."""
    try:
        return _RestrictedUnpickler(io.BytesIO(data), allowed, what, persistent_load).load()
    except (UnsafeCheckpoint, CorruptCheckpoint):
        raise
    except _MALFORMED as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CorruptCheckpoint(f"{what}: not a valid pickle ({detail[:200]})") from None


MAX_PLAIN_NODES = 100_000  # an optimizer's param_groups entry holds a handful of values


def plain_data(value: Any, *, depth: int = 0, max_depth: int = 32, max_nodes: int = MAX_PLAIN_NODES) -> Any:
    """Check that ``value`` is plain JSON-like data (scalars, str, lists, tuples, dicts) and return it.

    Used on BYTE_IO items after a restricted load: anything else, a nesting deeper than
    ``max_depth``, or more than ``max_nodes`` values in all raises ValueError, so callers can
    skip the item with a note. The node budget matters: a few hundred pickle bytes can share
    one list ten levels deep and describe 10**10 values that a plain walk would try to copy.
    """
    budget = [max_nodes]
    return _plain(value, depth, max_depth, budget)


def _plain(value: Any, depth: int, max_depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError("holds too many values (a shared-reference bomb?)")
    if depth > max_depth:
        raise ValueError("nested too deeply")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1, max_depth, budget) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise ValueError(f"dict key of type {type(k).__name__}")
            out[str(k)] = _plain(v, depth + 1, max_depth, budget)
        return out
    raise ValueError(f"holds a {type(value).__name__}")
