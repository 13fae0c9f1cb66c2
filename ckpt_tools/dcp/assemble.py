"""Turn a tensor's saved chunks into its output bytes, in order, with bounded memory.

Two cases cover every layout DCP writes:

- *row slabs* (FSDP/HSDP ``Shard(0)``, replicated tensors, scalars): each chunk is a run of
  whole rows stored contiguously, so the output is the chunks' bytes one after the other in
  row order. Without a dtype change they are handed out as :class:`Copy` ranges for a
  kernel-side copy (zero user-space memory); with one, they are converted block by block.
- anything else (``Shard(1)``, 2-D meshes, strided storage, big-endian bytes): the tensor is
  assembled in memory (one tensor at a time, convert-dcp's memory bound), each chunk placed through a
  strided view, then converted and handed out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ckpt_tools.dcp import casting
from ckpt_tools.dcp.files import ShardFiles, pread_exact
from ckpt_tools.dcp.index import Chunk, TensorEntry
from ckpt_tools.dcp.reader import ChunkLayout
from ckpt_tools.io.remote import Readable
from ckpt_tools.st.dtypes import DType

BLOCK = 8 * 2**20  # bytes of source read per step when converting


@dataclass(frozen=True)
class Copy:
    """``length`` bytes of shard file ``fd`` at ``offset`` go to the output unchanged."""

    fd: Readable
    offset: int
    length: int
    what: str


Piece = Copy | memoryview


def is_row_slabs(entry: TensorEntry, layouts: Sequence[ChunkLayout]) -> bool:
    shape = entry.shape
    for chunk, layout in zip(entry.chunks, layouts, strict=True):
        if chunk.numel == 0:
            continue
        if chunk.sizes[1:] != shape[1:] or any(chunk.offsets[1:]):
            return False
        if not layout.contiguous or (layout.byteorder != "little" and layout.dtype.itemsize > 1):
            return False
    return True


def tensor_pieces(
    entry: TensorEntry, layouts: Sequence[ChunkLayout], files: ShardFiles, out: DType, *, block: int = BLOCK
) -> Iterator[Piece]:
    """The output bytes of ``entry`` as ``out`` elements, as copy ranges or buffers, in order."""
    if is_row_slabs(entry, layouts):
        yield from _slab_pieces(entry, layouts, files, out, block)
    else:
        yield from _assembled_pieces(entry, layouts, files, out)


def _slab_pieces(
    entry: TensorEntry, layouts: Sequence[ChunkLayout], files: ShardFiles, out: DType, block: int
) -> Iterator[Piece]:
    pairs = sorted(
        ((c, lay) for c, lay in zip(entry.chunks, layouts, strict=True) if c.numel),
        key=lambda p: p[0].offsets[0] if p[0].offsets else 0,
    )
    for chunk, layout in pairs:
        fd = files.data_fd(chunk)
        what = _what(entry, chunk)
        src = layout.dtype
        if not casting.needs_cast(src, out):
            yield Copy(fd, layout.data_offset, layout.nbytes, what)
            continue
        step = max(src.itemsize, block - block % src.itemsize)
        for pos in range(0, layout.nbytes, step):
            n = min(step, layout.nbytes - pos)
            yield casting.cast_bytes(pread_exact(fd, n, layout.data_offset + pos, what=what), src, out)


def _assembled_pieces(
    entry: TensorEntry, layouts: Sequence[ChunkLayout], files: ShardFiles, out: DType
) -> Iterator[Piece]:
    import numpy as np
    from numpy.lib.stride_tricks import as_strided

    src = layouts[0].dtype if layouts else out
    raw = f"<u{src.itemsize}" if src.itemsize > 1 else "u1"
    full = np.empty(entry.shape, dtype=raw)
    for chunk, layout in zip(entry.chunks, layouts, strict=True):
        if chunk.numel == 0:
            continue
        extent = 1 + sum((s - 1) * st for s, st in zip(layout.size, layout.stride, strict=True))
        data = pread_exact(files.data_fd(chunk), extent * src.itemsize, layout.data_offset, what=_what(entry, chunk))
        flat = np.frombuffer(data, dtype=raw if layout.byteorder == "little" else f">u{src.itemsize}")
        view = as_strided(flat, shape=layout.size, strides=tuple(s * src.itemsize for s in layout.stride))
        box = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes, strict=True))
        full[box] = view
    yield casting.cast_bytes(full.reshape(-1), src, out)


def _what(entry: TensorEntry, chunk: Chunk) -> str:
    return f"{chunk.file} ({entry.fqn})"
