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
import itertools
import pickletools
import struct
from typing import Any, NamedTuple

from ckpt_tools.dcp.index_file import index_bytes, read_index
from ckpt_tools.io.local_path import is_local_path

_PUT_OPS = ("PUT", "BINPUT", "LONG_BINPUT")
_GET_OPS = ("GET", "BINGET", "LONG_BINGET")
_STRING_OPS = ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE")
_PATH_CLASSES = ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path")
_FIELD = "checkpoint_id"
_POP = b"0"  # the POP opcode
_FRAME_BYTES = 9  # the FRAME opcode and its 8-byte length
_WINDOW = 4096  # opcodes a checkpoint_id value may take (a path of thousands of parts is not one)


class NotRewritable(ValueError):
    """The metadata holds its checkpoint_id in a form this rewrite does not know."""


def relocated_metadata(data: bytes, published_dir: str) -> bytes | None:
    """``data`` (a DCP ``.metadata`` pickle) with ``checkpoint_id`` set to ``published_dir``.

    None when it records no path (nothing to rewrite); :class:`NotRewritable` when it records
    one this rewrite cannot replace safely. One pass over the opcodes, keeping only the frame
    positions and the few opcodes of the path: memory stays about twice the file's size.
    """
    frames: list[int] = []  # positions of the FRAME opcodes (9 bytes each), left out of the copy
    memo = 0  # memo slots filled so far by MEMOIZE
    window: list[Span] | None = None  # the opcodes from the checkpoint_id key on, until its value is built
    parts: list[Span] = []
    slots: dict[int, tuple[int, int]] = {}  # memo slot of a part -> (which part, where its memo opcode ends)
    reused: set[int] = set()  # those slots read again after the path (an equal string elsewhere)
    window_memo = 0
    explicit = False  # PUT opcodes (protocols 0-3) name their memo slot; MEMOIZE (4+) takes the next
    try:
        for op, arg, at in pickletools.genops(io.BytesIO(data)):
            name = op.name
            pos = at if at is not None else -1  # a BytesIO always gives the position
            if window is not None and not parts and name != "FRAME":  # a frame may start inside the path
                window.append(Span(name, arg, pos, -1))
                if name in ("REDUCE", "SETITEM", "SETITEMS", "STOP") or len(window) > _WINDOW:
                    parts, slots = _path_parts(_closed(window), window_memo)
                    window = None if parts else window
                    if not parts:
                        return None
            if name == "FRAME":
                frames.append(pos)
            elif name in _PUT_OPS:
                explicit = True
            elif name in _GET_OPS and parts and int(arg or 0) in slots:
                reused.add(int(arg or 0))
            elif name in _STRING_OPS and arg == _FIELD and window is None and not parts:
                window, window_memo = [Span(name, arg, pos, -1)], memo
            if name == "MEMOIZE":
                memo += 1
    except NotRewritable:
        raise
    except Exception as e:  # a damaged pickle: the checkpoint's own checks say so
        raise NotRewritable(f"not a readable pickle ({e})") from None
    if not parts:
        return None
    if explicit and memo:  # both kinds of memo slots: which slot a GET reads is not certain
        raise NotRewritable("a pickle that fills its memo both ways")
    return _spliced(data, frames, parts, dict(slots[slot] for slot in reused), published_dir)


def _spliced(data: bytes, frames: list[int], parts: list[Span], kept: dict[int, int], published_dir: str) -> bytes:
    """``data`` without its FRAME opcodes, the path's strings replaced: the last by ``published_dir``,
    the ones before it by empty strings.

    ``kept``: the parts read again later (by index), and where their memo opcodes end. Such a part stays in the
    memo as it was (an equal string elsewhere in the pickle refers to it): after its memo
    opcode, POP drops it from the stack and the replacement is pushed instead.
    """
    cuts = []
    for i, p in enumerate(parts):
        new = _string_op(published_dir if i == len(parts) - 1 else "")
        kept_end = kept.get(i)
        if kept_end is None:
            cuts.append((p.pos, p.end, new))
        else:
            cuts.append((kept_end, kept_end, _POP + new))
    # A FRAME right after a part lies inside that part's span, and goes with it.
    cuts += [(pos, pos + _FRAME_BYTES, b"") for pos in frames if not any(p.pos <= pos < p.end for p in parts)]
    out = bytearray()
    at = 0
    for pos, end, replacement in sorted(cuts):
        out += data[at:pos]
        out += replacement
        at = end
    out += data[at:]
    return bytes(out)


def relocated_index(data: bytes, metadata: bytes, published_dir: str, what: str) -> bytes:
    """The chunk index ``data`` bound to the rewritten ``metadata``, its checkpoint_id ``published_dir``."""
    table, binding = read_index(data, what=what)
    table = dataclasses.replace(table, checkpoint_id=published_dir)
    binding = dataclasses.replace(
        binding, metadata_size=len(metadata), metadata_sha256=hashlib.sha256(metadata).hexdigest()
    )
    return index_bytes(table, binding)


class Span(NamedTuple):
    """One opcode: its name, argument and bytes ``[pos, end)`` of the pickle."""

    name: str
    arg: Any
    pos: int
    end: int


def _closed(window: list[Span]) -> list[Span]:
    """The window's spans with their ends (each ends where the next begins; the last is dropped)."""
    return [w._replace(end=nxt.pos) for w, nxt in itertools.pairwise(window)]


def _path_parts(spans: list[Span], memo: int) -> tuple[list[Span], dict[int, tuple[int, int]]]:
    """The strings of the path after the ``checkpoint_id`` key (``spans[0]``), and their memo slots.

    Accepted: a plain string value, or ``pathlib.<X>Path`` built by REDUCE from one tuple of
    strings. ``memo``: the slots filled before ``spans[0]``. No parts: nothing local to rewrite.
    """
    counter = [memo]

    def stored(k: int) -> int | None:
        """The memo slot the opcode at ``k`` fills (None: it fills none)."""
        if k >= len(spans):
            return None
        if spans[k].name == "MEMOIZE":
            counter[0] += 1
            return counter[0] - 1
        return int(spans[k].arg) if spans[k].name in _PUT_OPS else None

    i = 1
    if stored(i) is not None:
        i += 1
    if i < len(spans) and spans[i].name == "NONE":
        return [], {}
    ends = ("STACK_GLOBAL", "GLOBAL")
    j = next((k for k in range(i, min(i + 5, len(spans))) if spans[k].name in ends), None)
    if j is None:
        if i < len(spans) and spans[i].name in _STRING_OPS:  # checkpoint_id saved as a str
            if not _is_absolute(str(spans[i].arg)):
                return [], {}
            slot = stored(i + 1)
            return [spans[i]], {} if slot is None else {slot: (0, spans[i + 1].end)}
        raise NotRewritable(f"{_FIELD} is neither a string nor a pathlib path")
    if spans[j].name == "GLOBAL":
        names = str(spans[j].arg).split(" ")
    else:
        names = [s.arg for s in spans[i:j] if s.name in _STRING_OPS]
        for k in range(i, j):
            stored(k)
    if names[:1] != ["pathlib"] or len(names) != 2 or names[1] not in _PATH_CLASSES:
        raise NotRewritable(f"{_FIELD} is neither a string nor a pathlib path")
    j += 1
    if stored(j) is not None:
        j += 1
    if j >= len(spans) or spans[j].name != "MARK":
        raise NotRewritable(f"{_FIELD}: its parts are not one tuple")
    parts: list[Span] = []
    slots: dict[int, tuple[int, int]] = {}
    k = j + 1
    # A part may be a GET of an equal string memoized earlier: replacing the GET changes no slot.
    while k < len(spans) and spans[k].name in (*_STRING_OPS, *_GET_OPS):
        parts.append(spans[k])
        slot = stored(k + 1)
        if slot is not None:
            slots[slot] = (len(parts) - 1, spans[k + 1].end)
            k += 2
        else:
            k += 1
    if k >= len(spans) or spans[k].name != "TUPLE" or not parts:
        raise NotRewritable(f"{_FIELD}: its parts are not one tuple of strings")
    return parts, slots


def _string_op(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) < 256:
        return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def _is_absolute(value: str) -> bool:
    return is_local_path(value)
