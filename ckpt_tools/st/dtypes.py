"""Tensor element types as torch names them, and what safetensors and numpy call them.

A DCP checkpoint names dtypes the way torch pickles them (``torch.float32`` in ``.metadata``,
``torch.FloatStorage`` or ``torch.UntypedStorage`` + dtype inside each chunk blob). The tools
never import torch, so this table is the one place where those names meet the safetensors
codes we write and the numpy types we compute with.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ckpt_tools.errors import CheckpointError


@dataclass(frozen=True)
class DType:
    """One element type. ``numpy`` is None where numpy has no exact equivalent (bf16, fp8).

    ``safetensors`` is None for the types torch saves in a DCP checkpoint that no safetensors
    file can hold (complex128, complex32, the sub-byte and bit types): they are read and checked
    like any other, and ``convert-dcp`` skips them with a note. ``packed`` is how many
    safetensors elements one torch element is: torch's float4_e2m1fn_x2 holds two 4-bit values a
    byte, which safetensors writes as ``F4`` with the last dim doubled (so a 0-d one has no form).
    """

    name: str  # torch's canonical name, without "torch."
    safetensors: str | None  # the safetensors header code (None: safetensors has none)
    itemsize: int
    numpy: str | None
    floating: bool
    packed: int = 1

    def __str__(self) -> str:
        return self.name

    def safetensors_shape(self, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """The shape a safetensors header gives a tensor of ``shape`` (None: it has none)."""
        if self.packed == 1:
            return shape
        return (*shape[:-1], shape[-1] * self.packed) if shape else None

    def torch_shape(self, header_shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """The torch shape of a safetensors entry of ``header_shape`` (None: not a whole number of elements)."""
        if self.packed == 1:
            return header_shape
        if not header_shape or header_shape[-1] % self.packed:
            return None
        return (*header_shape[:-1], header_shape[-1] // self.packed)

    @property
    def representable(self) -> bool:
        """Whether a safetensors file can hold tensors of this type."""
        return self.safetensors is not None


_TABLE = (
    DType("float64", "F64", 8, "<f8", True),
    DType("float32", "F32", 4, "<f4", True),
    DType("float16", "F16", 2, "<f2", True),
    DType("bfloat16", "BF16", 2, None, True),
    DType("float8_e4m3fn", "F8_E4M3", 1, None, True),
    DType("float8_e5m2", "F8_E5M2", 1, None, True),
    DType("float8_e4m3fnuz", "F8_E4M3FNUZ", 1, None, True),
    DType("float8_e5m2fnuz", "F8_E5M2FNUZ", 1, None, True),
    DType("float8_e8m0fnu", "F8_E8M0", 1, None, True),
    DType("complex64", "C64", 8, "<c8", False),
    DType("float4_e2m1fn_x2", "F4", 1, None, True, packed=2),
    DType("int64", "I64", 8, "<i8", False),
    DType("int32", "I32", 4, "<i4", False),
    DType("int16", "I16", 2, "<i2", False),
    DType("int8", "I8", 1, "|i1", False),
    DType("uint64", "U64", 8, "<u8", False),
    DType("uint32", "U32", 4, "<u4", False),
    DType("uint16", "U16", 2, "<u2", False),
    DType("uint8", "U8", 1, "|u1", False),
    DType("bool", "BOOL", 1, "|b1", False),
)

# Types a DCP checkpoint may hold that safetensors cannot: complex128 and complex32 have no
# code; the bit and sub-byte types are torch-internal shells (1 byte an element).
_UNREPRESENTABLE = (
    DType("complex128", None, 16, "<c16", False),
    DType("complex32", None, 4, None, False),
    DType("bits16", None, 2, None, False),
    *(DType(name, None, 1, None, False) for name in ("bits8", "bits1x8", "bits2x4", "bits4x2")),
    *(DType(f"{kind}{n}", None, 1, None, False) for kind in ("int", "uint") for n in range(1, 8)),
)

BY_NAME: dict[str, DType] = {d.name: d for d in (*_TABLE, *_UNREPRESENTABLE)}
BY_SAFETENSORS: dict[str, DType] = {d.safetensors: d for d in _TABLE if d.safetensors is not None}

# torch's aliases: a pickle names the canonical one, but older writers and users may not.
_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "long": "int64",
    "int": "int32",
    "short": "int16",
    "cfloat": "complex64",
    "cdouble": "complex128",
    "chalf": "complex32",
}

# Every dtype name torch has had, supported or not: `.metadata` may mention any of them, and
# an unsupported one is a clear "unsupported dtype", never an "unsafe global".
TORCH_DTYPE_NAMES: frozenset[str] = frozenset(
    {*BY_NAME, *_ALIASES}
    | {"complex32", "chalf", "complex64", "cfloat", "complex128", "cdouble"}
    | {"qint8", "quint8", "qint32", "quint4x2", "quint2x4"}
    | {"float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"}
    | {"bits1x8", "bits2x4", "bits4x2", "bits8", "bits16"}
    | {f"int{n}" for n in range(1, 8)}
    | {f"uint{n}" for n in range(1, 8)}
)

# The legacy typed-storage classes torch.save names in data.pkl (``_rebuild_tensor_v2``).
STORAGE_CLASSES: dict[str, str] = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64",
    "QInt8Storage": "qint8",
    "QUInt8Storage": "quint8",
    "QInt32Storage": "qint32",
    "QUInt4x2Storage": "quint4x2",
    "QUInt2x4Storage": "quint2x4",
}

# Output dtypes a user may ask convert-dcp for.
OUTPUT_DTYPES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def canonical_name(name: str) -> str:
    """``torch.float`` → ``float32``: the name torch prints for that dtype."""
    name = name.removeprefix("torch.")
    return _ALIASES.get(name, name)


def lookup(name: str, *, what: str = "tensor") -> DType:
    """The :class:`DType` for a torch dtype name; a clear error for one we cannot handle (quantized)."""
    canonical = canonical_name(name)
    found = BY_NAME.get(canonical)
    if found is None:
        supported = ", ".join(BY_NAME)
        raise CheckpointError(f"{what}: dtype {canonical} is not supported (supported: {supported})")
    return found


def is_known(name: str) -> bool:
    return canonical_name(name) in BY_NAME


def numel(shape: Iterable[int]) -> int:
    """Elements of a tensor of ``shape``: the product of its sizes (1 for a 0-d tensor).

    Every description of a tensor (a ``.metadata`` entry or chunk, a safetensors header entry,
    a chunk archive's record, a planned output) counts its elements with this one function.
    """
    return math.prod(shape)
