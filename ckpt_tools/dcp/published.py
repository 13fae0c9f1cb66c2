"""A DCP directory's ``.metadata`` and ``.metadata.index`` as a push publishes them: no local path inside.

``torch.distributed.checkpoint.save`` records the directory it wrote to in the metadata's
``storage_meta.checkpoint_id`` - a ``PosixPath`` of the save's (hidden, partial) directory,
``/home/alice/outputs/run/checkpoints/.005000.partial/...`` - and the chunk index beside it
(:mod:`ckpt_tools.dcp.index_file`) copies it. No reader needs it to load the shards (they are
found next to ``.metadata``), but it names a home directory and a user. A published copy
holds instead the directory's place in the published run, ``checkpoints/005000/...``:
relative, and where a download puts it.

The pickle is rewritten opcode by opcode (:func:`pickletools.genops`: read, never executed):
the strings of the path are replaced and everything else is copied as it is. The memo stays
as it was - the path keeps its number of parts (the last holds the new path, the ones before
it are empty, which ``pathlib`` and ``os.path.join`` both ignore) - and FRAME opcodes, mere length hints that would no longer
match, are left out (framing is optional for every unpickler). A metadata whose path is laid
out otherwise, or whose path strings are referred to again later, is not rewritten: the caller
refuses to publish it rather than publish the path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import pickletools
import struct
from typing import Any

from ckpt_tools.dcp.index_file import index_bytes, read_index

_STRING_OPS = ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE")
_PATH_CLASSES = ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path")
_FIELD = "checkpoint_id"


class NotRewritable(ValueError):
    """The metadata holds its checkpoint_id in a form this rewrite does not know."""


def relocated_metadata(data: bytes, published_dir: str) -> bytes | None:
    """``data`` (a DCP ``.metadata`` pickle) with ``checkpoint_id`` set to ``published_dir``.

    None when it records no path (nothing to rewrite); :class:`NotRewritable` when it records
    one this rewrite cannot replace safely.
    """
    try:
        ops = list(pickletools.genops(io.BytesIO(data)))
    except Exception as e:  # a damaged pickle: the checkpoint's own checks say so
        raise NotRewritable(f"not a readable pickle ({e})") from None
    ends = [pos for _op, _arg, pos in ops[1:]] + [len(data)]
    spans = [(op.name, arg, pos, end) for (op, arg, pos), end in zip(ops, ends, strict=True)]
    start = next((i for i, (name, arg, _p, _e) in enumerate(spans) if name in _STRING_OPS and arg == _FIELD), None)
    if start is None:
        return None
    replaced = _path_strings(spans, start)
    if replaced is None:
        return None
    out = bytearray()
    last = max(replaced)
    for i, (name, _arg, pos, end) in enumerate(spans):
        if name == "FRAME":
            continue
        if i in replaced:
            out += _string_op(published_dir if i == last else "")
        else:
            out += data[pos:end]
    return bytes(out)


def relocated_index(data: bytes, metadata: bytes, published_dir: str, what: str) -> bytes:
    """The chunk index ``data`` bound to the rewritten ``metadata``, its checkpoint_id ``published_dir``."""
    table, binding = read_index(data, what=what)
    table = dataclasses.replace(table, checkpoint_id=published_dir)
    binding = dataclasses.replace(
        binding, metadata_size=len(metadata), metadata_sha256=hashlib.sha256(metadata).hexdigest()
    )
    return index_bytes(table, binding)


def _path_strings(spans: list[tuple[str, Any, int, int]], start: int) -> set[int] | None:
    """The indexes of the ops holding the parts of the path that follows the ``checkpoint_id`` key.

    Accepted: a plain string value, or ``pathlib.<X>Path`` built by REDUCE from one tuple of
    memoized strings; the memo slots of those strings must never be read back (no GET of them).
    """
    i = start + 1
    if i < len(spans) and spans[i][0] == "MEMOIZE":
        i += 1
    if i < len(spans) and spans[i][0] == "NONE":
        return None
    j = next((k for k in range(i, min(i + 5, len(spans))) if spans[k][0] == "STACK_GLOBAL"), None)
    if j is None:
        if i < len(spans) and spans[i][0] in _STRING_OPS:  # checkpoint_id saved as a str
            return {i} if _is_absolute(str(spans[i][1])) else None
        raise NotRewritable(f"{_FIELD} is neither a string nor a pathlib path")
    names = [arg for name, arg, _p, _e in spans[i:j] if name in _STRING_OPS]
    if names[:1] != ["pathlib"] or len(names) != 2 or names[1] not in _PATH_CLASSES:
        raise NotRewritable(f"{_FIELD} is neither a string nor a pathlib path")
    j += 1 + (spans[j + 1][0] == "MEMOIZE")
    if spans[j][0] != "MARK":
        raise NotRewritable(f"{_FIELD}: its parts are not one tuple")
    parts: set[int] = set()
    memo_of_parts: set[int] = set()
    k = j + 1
    while spans[k][0] in _STRING_OPS:
        parts.add(k)
        if spans[k + 1][0] == "MEMOIZE":
            memo_of_parts.add(_memo_index(spans, k + 1))
            k += 2
        else:
            k += 1
    if spans[k][0] != "TUPLE" or not parts:
        raise NotRewritable(f"{_FIELD}: its parts are not one tuple of strings")
    if any(_reads_memo(spans, n) in memo_of_parts for n in range(len(spans))):
        raise NotRewritable(f"{_FIELD}: a part of its path is used again elsewhere in the pickle")
    return parts


def _memo_index(spans: list[tuple[str, Any, int, int]], at: int) -> int:
    """The memo slot the MEMOIZE at ``at`` fills (explicit PUTs make the count unknown: refused)."""
    if any(name in ("PUT", "BINPUT", "LONG_BINPUT") for name, _a, _p, _e in spans[:at]):
        raise NotRewritable("a pickle with explicit memo slots")
    return sum(1 for name, _a, _p, _e in spans[:at] if name == "MEMOIZE")


def _reads_memo(spans: list[tuple[str, Any, int, int]], at: int) -> int | None:
    name, arg = spans[at][0], spans[at][1]
    return int(arg) if name in ("GET", "BINGET", "LONG_BINGET") else None


def _string_op(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) < 256:
        return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def _is_absolute(value: str) -> bool:
    from ckpt_tools.hub.local_paths import is_local_path

    return is_local_path(value)
