"""A fingerprint of the process-wide objects a checkpoint pickle could reach, to prove none changed.

The restricted unpickler hands out long-lived objects (the allowlists' stand-in classes, small
functions, dtype stand-ins) and the training core's side once resolved real ``pathlib`` and
torch classes. A ``BUILD`` on one of them would change how every later file in the process is
read - a dtype stand-in renamed, ``pathlib.PurePath.__truediv__`` replaced - without any error.
:func:`fingerprint` captures all of them (attribute names and the identity of each value, a
function's defaults and code, an instance's fields), the dtype tables, ``pathlib``'s classes
and copyreg's process-wide extension tables; equal fingerprints before and after a load mean
it changed nothing it did not create.
"""

from __future__ import annotations

import copyreg
import pathlib
import types
from collections import OrderedDict
from typing import Any


def _describe(value: Any) -> Any:
    if isinstance(value, type):
        return ("class", value.__qualname__, sorted((k, id(v)) for k, v in vars(value).items()))
    if isinstance(value, types.FunctionType):
        return (
            "function",
            value.__qualname__,
            id(value.__code__),
            repr(value.__defaults__),
            repr(value.__kwdefaults__),
            sorted((k, id(v)) for k, v in vars(value).items()),
        )
    if hasattr(value, "__dict__"):
        return ("instance", type(value).__qualname__, repr(sorted(vars(value).items())))
    return ("value", repr(value))


def _allowlists() -> dict[str, Any]:
    from ckpt_tools.dcp import metadata, reader, validate

    return {
        "metadata": metadata.METADATA_ALLOWLIST,
        "reader": reader.TENSOR_ALLOWLIST,
        "plain objects": validate.PLAIN_OBJECTS,
    }


def fingerprint() -> dict[str, Any]:
    """Everything a pickle could reach and change, by name; compare two with ``==``."""
    from ckpt_tools.st import dtypes

    out: dict[str, Any] = {}
    for list_name, allowed in _allowlists().items():
        out[f"{list_name} allowlist keys"] = sorted(allowed)
        for (module, name), value in allowed.items():
            out[f"{list_name}: {module}.{name}"] = (id(value), _describe(value))
    for cls in (
        pathlib.PurePath,
        pathlib.PurePosixPath,
        pathlib.PureWindowsPath,
        pathlib.Path,
        pathlib.PosixPath,
        pathlib.WindowsPath,
        OrderedDict,
    ):
        out[f"class {cls.__module__}.{cls.__qualname__}"] = _describe(cls)
    for table in ("TORCH_DTYPE_NAMES", "BY_NAME", "STORAGE_CLASSES"):
        value = getattr(dtypes, table, None)
        out[f"dtypes.{table}"] = repr(value)
    out["copyreg extensions"] = (
        repr(copyreg._extension_registry),  # type: ignore[attr-defined]
        repr(copyreg._extension_cache),  # type: ignore[attr-defined]
    )
    return out


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Names of the entries that differ (empty: the process is as it was)."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
