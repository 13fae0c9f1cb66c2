"""``read_header`` calls a safetensors file healthy exactly when the safetensors library opens it.

The library parses the header with a strict JSON parser into ``{name: {dtype, shape,
data_offsets}}`` plus ``__metadata__: {str: str}``: one non-string metadata value, or a ``NaN``
that Python's ``json`` would take, and it refuses the whole file. ``inspect``, ``verify-resume``
and ``push`` judge safetensors files through ``read_header``, so each case below is written and
then opened by both.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from safetensors import safe_open

from ckpt_tools.errors import CkptError
from ckpt_tools.st.header import read_header

DATA = struct.pack("<4f", 1, 2, 3, 4)
W = '"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}'

HEADERS: dict[str, bytes] = {
    "plain": ("{" + W + "}").encode(),
    "string metadata": ('{"__metadata__": {"format": "pt"}, ' + W + "}").encode(),
    "integer metadata value": ('{"__metadata__": {"step": 4}, ' + W + "}").encode(),
    "null metadata value": ('{"__metadata__": {"a": null}, ' + W + "}").encode(),
    "object metadata value": ('{"__metadata__": {"a": {"b": "c"}}, ' + W + "}").encode(),
    "metadata not an object": ('{"__metadata__": [], ' + W + "}").encode(),
    "NaN in metadata": ('{"__metadata__": {"a": NaN}, ' + W + "}").encode(),
    "Infinity in an entry": b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16], "x": -Infinity}}',
    "unknown entry field": b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16], "x": 1}}',
    "float in a shape": b'{"w": {"dtype": "F32", "shape": [4.0], "data_offsets": [0, 16]}}',
    "padding spaces": ("{" + W + "}   ").encode(),
    "a NUL after the object": ("{" + W + "}\x00").encode(),
    "bad UTF-8": b"{" + W.encode() + b', "\xff": 1}',
    "duplicate key": ("{" + W + ", " + W + "}").encode(),
}


def _library_opens(path: Path) -> bool:
    try:
        with safe_open(str(path), "np") as f:
            list(f.keys())
            f.metadata()
    except Exception:  # the library's errors have no common type
        return False
    return True


def _healthy(path: Path) -> bool:
    try:
        return read_header(path).healthy
    except CkptError:
        return False


@pytest.mark.parametrize("name", list(HEADERS))
def test_healthy_exactly_when_the_library_opens_it(name: str, tmp_path: Path) -> None:
    header = HEADERS[name]
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + DATA)
    assert _healthy(path) == _library_opens(path), name
