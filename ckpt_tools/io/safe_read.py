"""Read the small files of a checkpoint (JSON, headers, ``.metadata``) without trusting them.

A checkpoint is a directory anyone could have made, so a file in it may be a FIFO (opening it
blocks forever), a symlink to ``/dev/zero`` (reading it never ends), a directory, or
gigabytes where a few hundred bytes belong; its JSON may nest a hundred thousand levels deep
(``json`` raises RecursionError) or spell a 5000-digit integer (ValueError; any integer beyond
64 bits is refused, since a product of two 4000-digit ones can no longer be printed). These helpers
turn all of that into the two exception types the callers already handle - ``OSError`` for
"cannot read it" and ``ValueError`` for "not what it should be" - instead of a hang, a
memory blow-up or a traceback.

:func:`read_json_file` is the one way the project reads a small JSON file: it adds the
user-facing side, one :class:`~ckpt_tools.errors.CkptError` line that names the file.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

from ckpt_tools.errors import CheckpointError, CkptError
from ckpt_tools.io.remote import as_path, read_remote_whole, remote_file

MAX_JSON_BYTES = 64 * 2**20  # a train_config.json is a few KB; an index json a few MB at most
MAX_JSON_INT = 2**64  # |integer| < 2**64: what a uint64 / int64 loader can hold


class NotRegularFile(OSError):
    """The path is a FIFO, a device, a socket or a directory: nothing a checkpoint file can be."""


class InvalidJson(ValueError):
    """Text that is not a JSON document ``json`` can decode safely (syntax, nesting, huge numbers)."""


def open_regular(path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> int:
    """A read-only descriptor on ``path``, which must be a regular file (symlinks followed unless told not to).

    ``O_NONBLOCK`` makes opening a FIFO return at once, so the type check can refuse it; on a
    regular file the flag changes nothing.
    """
    nofollow = 0 if follow_symlinks else getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | nofollow | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "directory" if stat.S_ISDIR(mode) else "FIFO, device or socket"
            raise NotRegularFile(errno.EINVAL, f"not a regular file (a {kind})", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole content of a regular file of at most ``limit`` bytes (a remote one: by ranged reads)."""
    remote = remote_file(path)
    if remote is not None:
        return read_remote_whole(remote, limit, str(path))
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise OSError(errno.EFBIG, f"{size} bytes, more than the {limit} such a file can hold", str(path))
        chunks, got = [], 0
        while got <= limit:
            data = os.read(fd, min(1 << 20, limit + 1 - got))
            if not data:
                break
            chunks.append(data)
            got += len(data)
        if got > limit:
            raise OSError(errno.EFBIG, f"more than the {limit} bytes such a file can hold", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike[str], limit: int = MAX_JSON_BYTES) -> str:
    """UTF-8 text of a regular file (UnicodeDecodeError, a ValueError, for other bytes)."""
    return read_bytes(path, limit).decode("utf-8")


def parse_json(text: str | bytes, *, strict: bool = False) -> Any:
    """``json.loads`` whose only failure is :class:`InvalidJson` (a ValueError).

    Integers are limited to what 64 bits hold (:data:`MAX_JSON_INT`): a checkpoint's JSON never
    needs more (safetensors shapes and offsets, steps, sizes are all 64-bit for the loaders that
    read them), and a longer one only costs time - Python parses it quadratically - and breaks
    whatever later multiplies or prints it (an integer of over 4300 digits cannot be printed).
    ``strict``: also refuse ``NaN`` and ``Infinity``, which Python writes and reads but JSON
    has not (the safetensors library's parser refuses a header holding one).
    """
    try:
        if strict:
            return json.loads(text, parse_int=_bounded_int, parse_constant=_no_constant)
        return json.loads(text, parse_int=_bounded_int)
    except RecursionError:
        raise InvalidJson("JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, 4300-digit integers, bad UTF-8 in bytes
        message = e.msg if isinstance(e, json.JSONDecodeError) else str(e).split(";")[0]
        where = f" at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
        raise InvalidJson(f"{message}{where}") from None


def _no_constant(text: str) -> Any:
    raise InvalidJson(f"{text} is not JSON")


def _bounded_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    value = int(text) if digits <= 20 else None  # 2**64 has 20 digits: never parse a longer one
    if value is None or not -MAX_JSON_INT < value < MAX_JSON_INT:
        raise InvalidJson(f"integer of {digits} digits, more than 64 bits hold")
    return value


def read_json(path: str | os.PathLike[str], limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file: ``OSError`` (missing, unreadable, not a file, too big) or ``ValueError`` (bad content)."""
    return parse_json(read_text(as_path(path), limit))


def read_json_file(
    path: str | os.PathLike[str],
    *,
    label: str | None = None,
    missing: str = "missing",
    want_object: bool = False,
    error: type[CkptError] = CheckpointError,
) -> Any:
    """A small JSON file (a checkpoint's sidecar, a config) as data, or one line the user can act on.

    Every failure is ``error`` (:class:`CheckpointError` unless the caller says otherwise),
    naming ``label`` (default: the path): ``"{label}: {missing}"`` when the file does not
    exist; ``unreadable (...)`` when it cannot be read (a FIFO, a directory, too big); ``not
    valid JSON (...)`` for bad syntax, bytes that are not UTF-8, a nesting bomb or a huge
    integer; ``expected a JSON object`` when ``want_object`` and the document is not one.
    """
    where = label if label is not None else str(path)
    try:
        data = read_json(path)
    except FileNotFoundError:
        raise error(f"{where}: {missing}") from None
    except OSError as e:
        raise error(f"{where}: unreadable ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise error(f"{where}: not valid JSON (not UTF-8 text)") from None
    except ValueError as e:
        raise error(f"{where}: not valid JSON ({e})") from None
    if want_object and not isinstance(data, dict):
        raise error(f"{where}: expected a JSON object, not {type(data).__name__}")
    return data
