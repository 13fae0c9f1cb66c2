"""Every line of human output goes through here: strings from checkpoints are shown, never obeyed.

Tensor names, JSON strings, file and directory names come from files anyone can write. Printed
raw, an escape sequence in a tensor name erases the line it is on (``"\\x1b[2K\\r  ok  healthy"``
prints a fake verdict), a newline starts a line that looks like ours, a bidi override
(U+202E) turns the rest of the line around, and a lone surrogate (``json.loads`` accepts
``"\\udc80"``; a non-UTF-8 file name decodes to one) makes the write itself raise
``UnicodeEncodeError``: a traceback instead of a verdict.

Escaping at the one place lines are written, rather than where each value is formatted,
means a new message cannot forget it: :func:`echo` is the only writer the CLI modules use
(``tests/test_untrusted_output.py`` checks that). What it escapes is what a terminal obeys or
cannot encode - C0 and C1 controls, DEL, the Unicode line and paragraph separators, the bidi
embeddings, overrides and isolates, lone surrogates - written as Python writes them
(``\\x1b``, ``\\n``, ``\\u202e``, ``\\udc80``); every other character, non-ASCII letters
included, is left as it is, unless the stream's encoding lacks it (an ASCII stdout shows ``é``
as ``\\xe9``). ``--json`` output needs none of this: :func:`emit_json` writes
ASCII only, JSON's own escapes for everything else (``"\\udc80"``), so it parses back to the
very strings read and no stdout encoding can refuse it.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, TextIO

import typer

__all__ = ["echo", "emit_json", "printable"]

# C0, DEL + C1, U+2028/9 (line/paragraph separators), U+202A-E (bidi embeddings, overrides),
# U+2066-9 (bidi isolates), and every surrogate code point (only lone ones reach a str).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


def printable(text: str) -> str:
    """``text`` with what a terminal would obey or cannot encode escaped; the rest unchanged.

    Idempotent (an escape is plain ASCII), so a table may escape its cells to align them and
    :func:`echo` escape the whole line again. A backslash is left alone: ``\\x1b`` in the
    output is either an escaped ESC or those four characters - ``--json`` tells them apart.
    """
    return _UNPRINTABLE.sub(_escaped, text)


def _encodable(text: str, stream: TextIO | None) -> str:
    """``text`` as ``stream`` can encode it: characters its encoding lacks become ``\\xe9``-style escapes.

    An ASCII stdout (``PYTHONIOENCODING=ascii``) cannot hold ``é``: shown escaped, not a
    traceback.
    """
    encoding = getattr(stream, "encoding", None)
    if not encoding:
        return text
    try:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    except (LookupError, UnicodeError):  # an encoding Python does not know, or one that cannot round-trip
        return text.encode("ascii", "backslashreplace").decode("ascii")


def echo(line: str = "", *, err: bool = False) -> None:
    """Write one line of human output (stdout, or stderr with ``err``), every untrusted character escaped.

    ``line`` is one line: a newline in it is shown as ``\\n``, so a caller with several lines
    echoes each one (a value read from a file cannot start a line of its own).
    """
    stream = sys.stderr if err else sys.stdout
    typer.echo(_encodable(printable(line), stream), err=err)


def emit_json(payload: Any) -> None:
    """Machine output: one JSON document on stdout, ASCII only (``ensure_ascii``), whatever the strings hold."""
    sys.stdout.write(json.dumps(payload, indent=2, default=str, ensure_ascii=True) + "\n")
