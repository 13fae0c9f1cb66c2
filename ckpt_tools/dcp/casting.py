"""Element-type conversion of raw little-endian tensor bytes, matching torch's results bit for bit.

Conversions go through float32 exactly as torch's CPU kernels do (float64 → bfloat16 is
rounded to float32 first, then to bfloat16), so ``convert-dcp --dtype bf16`` writes what
``tensor.to(torch.bfloat16)`` would. float32 → bfloat16 is round-to-nearest-even on the bit
pattern; NaN stays NaN (sign kept, quiet bit set) and overflow rounds to infinity.
float32 → float16 is numpy's, which is IEEE round-to-nearest-even as torch's.

The five float8 types widen exactly, so they go through a 256-entry table per output type
holding torch's own bit patterns (its NaNs included: ``tensor.to(torch.bfloat16)`` of any float8
NaN is ``0x7FC0``); they are a source type only, never an output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckpt_tools.st.dtypes import DType

if TYPE_CHECKING:
    import numpy as np

FLOAT8 = frozenset({"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"})
CASTABLE = frozenset({"float64", "float32", "float16", "bfloat16"}) | FLOAT8
OUTPUTS = frozenset({"float64", "float32", "float16", "bfloat16"})


def needs_cast(src: DType, dst: DType) -> bool:
    return src.name != dst.name


def can_cast(src: DType, dst: DType) -> bool:
    return src.name == dst.name or (src.name in CASTABLE and dst.name in OUTPUTS)


# float8 format → (exponent bits, exponent bias, "fnuz": 0x80 is the only NaN, no -0, no inf)
_FLOAT8_FORMATS = {
    "float8_e4m3fn": (4, 7, False),
    "float8_e4m3fnuz": (4, 8, True),
    "float8_e5m2": (5, 15, False),
    "float8_e5m2fnuz": (5, 16, True),
}
_FLOAT8_TABLES: dict[tuple[str, str], np.ndarray] = {}


def float8_to_float32_bits(name: str) -> np.ndarray:
    """The float32 bit pattern torch gives each of the 256 values of float8 type ``name`` (uint32[256])."""
    import numpy as np

    b = np.arange(256, dtype=np.uint32)
    if name == "float8_e8m0fnu":  # exponent only: 2**(b - 127); 0xFF is NaN
        out = np.where(b == 0, np.uint32(0x00400000), b << 23).astype(np.uint32)  # 2**-127 is subnormal
        out[255] = 0x7F800001
        return out
    if name == "float8_e5m2":  # the top byte of a float16: widen it as one, NaNs quieted as torch does
        out = (b << 8).astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
        nan = (out & 0x7FFFFFFF) > 0x7F800000
        out[nan] |= np.uint32(0x00400000)
        return out
    ebits, bias, fnuz = _FLOAT8_FORMATS[name]
    mbits = 7 - ebits
    exp = ((b >> mbits) & ((1 << ebits) - 1)).astype(np.int64)
    mant = (b & ((1 << mbits) - 1)).astype(np.float64)
    magnitude = np.where(
        exp == 0, np.ldexp(mant / (1 << mbits), 1 - bias), np.ldexp(1 + mant / (1 << mbits), exp - bias)
    )
    out = np.where(b & 0x80, -magnitude, magnitude).astype(np.float32).view(np.uint32)
    if fnuz:
        out[0x80] = 0x7F800001
    else:  # e4m3fn: S.1111.111 is NaN, spelled with the mantissa shifted into place
        for code in (0x7F, 0xFF):
            out[code] = ((code & 0x80) << 24) | 0x7FF00000
    return out


def _float8_table(src: str, dst: str) -> np.ndarray:
    """Output bits for each float8 byte value of ``src`` as ``dst`` (float64/32/16 or bfloat16)."""
    import numpy as np

    key = (src, dst)
    table = _FLOAT8_TABLES.get(key)
    if table is None:
        bits = float8_to_float32_bits(src)
        values = bits.view(np.float32)
        if dst == "float32":
            table = bits.view("<f4")
        elif dst == "float64":
            with np.errstate(invalid="ignore"):
                table = values.astype("<f8")
        elif dst == "float16":
            with np.errstate(over="ignore", invalid="ignore"):
                table = values.astype("<f2").view("<u2")
            quiet_lost = np.isnan(values) & ((table & 0x0200) == 0)  # a payload in the low bits only
            table[quiet_lost] = (table[quiet_lost] & 0x8000) | 0x7E00
        else:
            table = float32_to_bfloat16_bits(values.copy())
            table[np.isnan(values)] = 0x7FC0
        _FLOAT8_TABLES[key] = table
    return table


def to_float32(data: bytes | memoryview | np.ndarray, src: DType) -> np.ndarray:
    """Decode little-endian bytes of ``src`` into a float32 array (exact except float64 → float32)."""
    import numpy as np

    raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
    if src.name == "float32":
        return raw.view("<f4")
    if src.name == "float64":
        return raw.view("<f8").astype(np.float32)
    if src.name == "float16":
        return raw.view("<f2").astype(np.float32)
    if src.name == "bfloat16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    raise ValueError(f"cannot convert {src.name} to a float type")


def float32_to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest, ties to even); return the uint16 bit patterns."""
    import numpy as np

    bits = values.view(np.uint32)
    lsb = (bits >> 16) & 1
    rounded = bits + np.uint32(0x7FFF)
    rounded += lsb
    rounded >>= 16
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        rounded[nan] = (bits[nan] >> 16) | np.uint32(0x0040)
    return rounded.astype(np.uint16)


def cast_bytes(data: bytes | memoryview | np.ndarray, src: DType, dst: DType) -> memoryview:
    """Little-endian bytes of ``src`` elements → little-endian bytes of ``dst`` elements."""
    import numpy as np

    if src.name == dst.name:
        return memoryview(data if not isinstance(data, np.ndarray) else data.view(np.uint8).reshape(-1)).cast("B")
    if not can_cast(src, dst):
        raise ValueError(f"cannot convert {src.name} to {dst.name}")
    if src.name in FLOAT8:
        raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
        return memoryview(_float8_table(src.name, dst.name)[raw].view(np.uint8).reshape(-1))
    values = to_float32(data, src)
    if dst.name == "float32":
        out = values if values.flags.c_contiguous else np.ascontiguousarray(values)
    elif dst.name == "float16":
        with np.errstate(over="ignore"):  # overflow to ±inf is the IEEE (and torch) result
            out = values.astype("<f2")
    elif dst.name == "bfloat16":
        out = float32_to_bfloat16_bits(values)
    else:  # float64 output: exact widening of the float32 values (only from float32-based inputs)
        out = values.astype("<f8")
    return memoryview(out.view(np.uint8).reshape(-1))
