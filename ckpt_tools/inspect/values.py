"""Count NaN and infinite values in saved tensors, torch-free, a block at a time.

``inspect --check-values`` reads every tensor of a safetensors file or a DCP directory and
reports, per tensor, how many of its elements are NaN and how many ±inf. The test is on the
bit patterns (an all-ones exponent; a zero mantissa is an infinity, any other a NaN), so
every float type is handled the same way, bfloat16 and float8 included, and byte order is a
view, not a conversion. Data is read with ``pread`` in blocks of :data:`BLOCK` bytes (a
strided DCP chunk a slab at a time), so memory stays bounded whatever the checkpoint's size.
Integer and bool tensors cannot hold either and are skipped. The bytes examined are reported to
the command's progress bar (:mod:`ckpt_tools.io.progress`), if it shows one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckpt_tools.dcp.files import ShardFiles, pread_exact
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.dcp.reader import ChunkLayout
from ckpt_tools.dcp.validate import tensor_layouts
from ckpt_tools.errors import CheckpointError
from ckpt_tools.io import progress
from ckpt_tools.io.remote import Readable
from ckpt_tools.io.safe_read import open_regular
from ckpt_tools.st import dtypes
from ckpt_tools.st.dtypes import DType
from ckpt_tools.st.header import SafetensorsHeader

if TYPE_CHECKING:
    import numpy as np

BLOCK = 16 * 2**20  # bytes read (and examined) at a time

# dtype → (unsigned code, exponent mask, mantissa mask); float8_e4m3fn has no infinity: its only
# special value, NaN, is an all-ones exponent *and* mantissa.
_BITS: dict[str, tuple[str, int, int]] = {
    "float64": ("u8", 0x7FF0000000000000, 0x000FFFFFFFFFFFFF),
    "float32": ("u4", 0x7F800000, 0x007FFFFF),
    "float16": ("u2", 0x7C00, 0x03FF),
    "bfloat16": ("u2", 0x7F80, 0x007F),
    "float8_e5m2": ("u1", 0x7C, 0x03),
    "float8_e4m3fn": ("u1", 0x7F, 0x00),
    "float8_e4m3fnuz": ("u1", 0x00, 0x00),
    "float8_e5m2fnuz": ("u1", 0x00, 0x00),
    "float8_e8m0fnu": ("u1", 0x00, 0x00),
}
# The "fnuz" float8 types and e8m0 have no infinity and a single NaN: one bit pattern each.
_SINGLE_NAN = {"float8_e4m3fnuz": 0x80, "float8_e5m2fnuz": 0x80, "float8_e8m0fnu": 0xFF}


def checked(dtype: DType) -> bool:
    """Whether tensors of ``dtype`` can hold NaN or infinities (and so are read)."""
    return dtype.name in _BITS


def count_nonfinite(bits: np.ndarray, dtype: DType) -> tuple[int, int]:
    """(NaN, ±inf) among ``bits``, the elements' raw unsigned integers (native values, any byte order)."""
    import numpy as np

    if dtype.numpy is not None:  # float16/32/64: numpy's own test is several times faster than the masks
        values = bits.view(bits.dtype.str.replace("u", "f"))
        finite = np.isfinite(values)
        if finite.all():
            return 0, 0
        nan = int(np.count_nonzero(np.isnan(values)))
        return nan, int(finite.size - np.count_nonzero(finite)) - nan
    if dtype.name in _SINGLE_NAN:
        return int(np.count_nonzero(bits == bits.dtype.type(_SINGLE_NAN[dtype.name]))), 0
    _, exponent, mantissa = _BITS[dtype.name]
    special = (bits & bits.dtype.type(exponent)) == exponent
    if not special.any():
        return 0, 0
    if dtype.name == "float8_e4m3fn":
        return int(np.count_nonzero(special)), 0  # 0x7F or 0xFF: its only special value is NaN
    marked = bits[special]
    fraction = (marked & marked.dtype.type(mantissa)) != 0
    nan = int(np.count_nonzero(fraction))
    return nan, int(marked.size - nan)


def _view(data: bytes, dtype: DType, byteorder: str = "little") -> np.ndarray:
    import numpy as np

    code = _BITS[dtype.name][0]
    return np.frombuffer(data, dtype=("<" if byteorder == "little" else ">") + code if code != "u1" else "u1")


@dataclass(frozen=True)
class NonFinite:
    """One tensor holding NaN or infinite values: how many of each."""

    file: str  # the container, as inspect names it (relative to the step dir)
    tensor: str
    nan: int
    inf: int

    def describe(self) -> str:
        counts = [f"{n} {what}" for n, what in ((self.nan, "NaN"), (self.inf, "inf")) if n]
        return f"{self.tensor} ({', '.join(counts)})"


@dataclass(frozen=True)
class ValueScan:
    """What reading one container's tensor data found."""

    file: str
    tensors: int  # floating-point tensors read
    values: int  # their elements
    nonfinite: tuple[NonFinite, ...]


class _Counter:
    def __init__(self) -> None:
        self.nan = 0
        self.inf = 0

    def add(self, counts: tuple[int, int]) -> None:
        self.nan += counts[0]
        self.inf += counts[1]


def _blocks(fd: Readable, offset: int, length: int, itemsize: int, what: str) -> Iterator[bytes]:
    step = max(itemsize, BLOCK - BLOCK % itemsize)
    for pos in range(0, length, step):
        data = pread_exact(fd, min(step, length - pos), offset + pos, what=what)
        progress.current().advance(len(data))
        yield data


# ====================================================================== safetensors


def scan_safetensors(header: SafetensorsHeader, rel: str) -> ValueScan:
    """Every floating tensor of a safetensors file whose header is sane (``header.problems`` empty)."""
    found, tensors, values = [], 0, 0
    progress.current().expect(sum(e.nbytes for e in header.entries.values() if checked(dtypes.BY_SAFETENSORS[e.dtype])))
    try:
        fd = open_regular(header.path)
    except OSError as e:
        raise CheckpointError(f"{header.path}: unreadable ({e.strerror or e})") from None
    try:
        for entry in header.entries.values():
            dtype = dtypes.BY_SAFETENSORS[entry.dtype]
            if not checked(dtype):
                continue
            counter = _Counter()
            what = f"{header.path} ({entry.name})"
            for data in _blocks(fd, header.data_start + entry.begin, entry.nbytes, dtype.itemsize, what):
                counter.add(count_nonfinite(_view(data, dtype), dtype))
            tensors, values = tensors + 1, values + entry.numel
            if counter.nan or counter.inf:
                found.append(NonFinite(rel, entry.name, counter.nan, counter.inf))
    finally:
        os.close(fd)
    return ValueScan(rel, tensors, values, tuple(found))


# ====================================================================== DCP


def scan_dcp(index: ChunkIndex, rel: str) -> ValueScan:
    """Every floating tensor of a DCP directory that passed its structure and archive checks."""
    found, tensors, values = [], 0, 0
    scanned = [e for e in index.tensors.values() if dtypes.is_known(e.dtype) and checked(dtypes.lookup(e.dtype))]
    progress.current().expect(sum(e.nbytes or 0 for e in scanned))
    with ShardFiles(index.root) as files:
        for entry in scanned:
            counter = _Counter()
            for chunk, layout in zip(entry.chunks, tensor_layouts(entry, files), strict=True):
                if chunk.numel:
                    _chunk_counts(files.data_fd(chunk), layout, counter, f"{chunk.file} ({entry.fqn})")
            tensors, values = tensors + 1, values + entry.numel
            if counter.nan or counter.inf:
                found.append(NonFinite(rel, entry.fqn, counter.nan, counter.inf))
    return ValueScan(rel, tensors, values, tuple(found))


def _chunk_counts(fd: Readable, layout: ChunkLayout, counter: _Counter, what: str) -> None:
    dtype = layout.dtype
    if layout.contiguous:
        for data in _blocks(fd, layout.data_offset, layout.nbytes, dtype.itemsize, what):
            counter.add(count_nonfinite(_view(data, dtype, layout.byteorder), dtype))
        return
    _strided_counts(fd, layout, layout.data_offset, layout.size, layout.stride, counter, what)


def _strided_counts(
    fd: Readable,
    layout: ChunkLayout,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    counter: _Counter,
    what: str,
) -> None:
    """A strided view, read as the span of storage it covers when that fits a block, else in
    slabs along its widest-strided dimension (recursively)."""
    from numpy.lib.stride_tricks import as_strided

    itemsize = layout.dtype.itemsize
    extent = 1 + sum((s - 1) * st for s, st in zip(size, stride, strict=True))
    if extent * itemsize <= BLOCK:
        flat = _view(pread_exact(fd, extent * itemsize, offset, what=what), layout.dtype, layout.byteorder)
        view = as_strided(flat, shape=size, strides=tuple(st * itemsize for st in stride), writeable=False)
        counter.add(count_nonfinite(view.reshape(-1), layout.dtype))
        progress.current().advance(view.size * itemsize)  # the elements examined, not the span read
        return
    outer = max(range(len(size)), key=lambda d: stride[d] * (size[d] - 1))
    group = max(1, BLOCK // (stride[outer] * itemsize))  # slabs per read along that dimension
    for start in range(0, size[outer], group):
        sub = (*size[:outer], min(group, size[outer] - start), *size[outer + 1 :])
        _strided_counts(fd, layout, offset + start * stride[outer] * itemsize, sub, stride, counter, what)
