"""Read the values of 0-d tensors out of a DCP directory, torch-free (Adam's ``step`` counters).

Each such tensor is one chunk: a ``torch.save`` archive whose layout
:func:`~ckpt_tools.dcp.validate.tensor_layouts` reads and checks against ``.metadata``; the
element itself is then a few bytes at the layout's data offset.
"""

from __future__ import annotations

from ckpt_tools.dcp.files import ShardFiles, pread_exact
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.dcp.validate import tensor_layouts
from ckpt_tools.errors import CorruptCheckpoint
from ckpt_tools.st.scalars import decode_scalar


def read_scalars(index: ChunkIndex, fqns: list[str]) -> dict[str, float]:
    """fqn → value for the 0-d tensors ``fqns`` of ``index``; raises a one-line :class:`CkptError`."""
    out: dict[str, float] = {}
    with ShardFiles(index.root) as files:
        for fqn in fqns:
            entry = index.tensors[fqn]
            if entry.shape != () or len(entry.chunks) != 1:
                raise CorruptCheckpoint(f"{index.root}: {fqn} is not one number")
            (layout,) = tensor_layouts(entry, files)
            chunk = entry.chunks[0]
            what = f"{chunk.file} ({fqn})"
            raw = pread_exact(files.data_fd(chunk), layout.dtype.itemsize, layout.data_offset, what=what)
            out[fqn] = decode_scalar(raw, layout.dtype, layout.byteorder)
    return out
