"""Read the value of a 0-d tensor (Adam's ``step``, say) without torch.

The resume's consistency rule (:mod:`ckpt_tools.format.rules.consistency`) compares a few
counters a checkpoint holds as scalars with the step its record names. They are read here
straight from the bytes: a safetensors entry, or (through :mod:`ckpt_tools.dcp.scalars`) a
DCP chunk, whose dtype and byte order the caller passes in.
"""

from __future__ import annotations

import os
import struct

from ckpt_tools.errors import CorruptCheckpoint
from ckpt_tools.io.safe_read import open_regular
from ckpt_tools.st import dtypes
from ckpt_tools.st.dtypes import DType
from ckpt_tools.st.header import SafetensorsHeader

_STRUCT = {"float64": "d", "float32": "f", "float16": "e", "int64": "q", "int32": "i", "int16": "h", "int8": "b"}
_STRUCT |= {"uint64": "Q", "uint32": "I", "uint16": "H", "uint8": "B", "bool": "?"}


def decode_scalar(raw: bytes, dtype: DType, byteorder: str = "little") -> float:
    """The number ``raw`` (exactly one element of ``dtype``) holds; bfloat16 is the top half of a float32."""
    if len(raw) != dtype.itemsize:
        raise CorruptCheckpoint(f"{len(raw)} bytes for one {dtype.name} value")
    order = "<" if byteorder == "little" else ">"
    if dtype.name == "bfloat16":
        bits = int.from_bytes(raw, byteorder)  # type: ignore[arg-type]
        return float(struct.unpack("<f", (bits << 16).to_bytes(4, "little"))[0])
    code = _STRUCT.get(dtype.name)
    if code is None:
        raise CorruptCheckpoint(f"a {dtype.name} scalar cannot be read as a number")
    return float(struct.unpack(order + code, raw)[0])


def read_scalars(header: SafetensorsHeader, names: list[str]) -> dict[str, float]:
    """The values of the 0-d entries ``names`` of the file ``header`` was read from."""
    out: dict[str, float] = {}
    fd = open_regular(header.path)
    try:
        for name in names:
            entry = header.entries[name]
            dtype = dtypes.BY_SAFETENSORS.get(entry.dtype)
            if dtype is None or entry.numel != 1 or entry.nbytes != dtype.itemsize:
                raise CorruptCheckpoint(f"{header.path}: {name} is not one number")
            raw = os.pread(fd, dtype.itemsize, header.data_start + entry.begin)
            if len(raw) != dtype.itemsize:
                raise CorruptCheckpoint(f"{header.path}: file ends inside {name}")
            out[name] = decode_scalar(raw, dtype)
    finally:
        os.close(fd)
    return out
