"""Element-type conversion of raw little-endian tensor bytes, matching torch's results bit for bit.

Conversions go through float32 exactly as torch's CPU kernels do (float64 → bfloat16 is
rounded to float32 first, then to bfloat16), so ``convert-dcp --dtype bf16`` writes what
``tensor.to(torch.bfloat16)`` would. float32 → bfloat16 is round-to-nearest-even on the bit
pattern; NaN stays NaN (sign kept, quiet bit set) and overflow rounds to infinity.
float32 → float16 is numpy's, which is IEEE round-to-nearest-even as torch's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckpt_tools.st.dtypes import DType

if TYPE_CHECKING:
    import numpy as np

CASTABLE = frozenset({"float64", "float32", "float16", "bfloat16"})


def needs_cast(src: DType, dst: DType) -> bool:
    return src.name != dst.name


def can_cast(src: DType, dst: DType) -> bool:
    return src.name == dst.name or (src.name in CASTABLE and dst.name in CASTABLE)


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
