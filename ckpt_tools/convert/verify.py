"""Reading a written output back: its header and every byte compared with what the chunks say it holds.

Done before the commit with ``--verify`` and always with ``--delete-dcp``; also how a rerun
recognizes an output that already holds exactly the planned bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from ckpt_tools.convert.records import PlannedFile
from ckpt_tools.dcp.assemble import Copy, tensor_pieces
from ckpt_tools.dcp.files import ShardFiles, pread_exact
from ckpt_tools.dcp.reader import ChunkLayout
from ckpt_tools.errors import WriteError
from ckpt_tools.st.header import read_header
from ckpt_tools.st.writer import COPY_BLOCK


def verify_file(
    path: Path,
    planned: PlannedFile,
    layouts: Mapping[str, list[ChunkLayout]],
    files: ShardFiles,
    metadata: dict[str, str],
) -> None:
    """Re-read ``path`` and compare header and every byte with what the chunks say it must hold."""
    header = read_header(path)
    final = path.name
    if header.problems:
        raise WriteError(f"{final}: written file failed its header check ({header.problems[0]}); nothing deleted")
    if list(header.entries) != [t.name for t in planned.tensors] or header.metadata != metadata:
        raise WriteError(f"{final}: written header does not match the plan; nothing deleted")
    fd = os.open(path, os.O_RDONLY)
    try:
        for tensor in planned.tensors:
            entry = header.entries[tensor.name]
            if entry.dtype != tensor.dtype.safetensors or entry.shape != tensor.dtype.safetensors_shape(tensor.shape):
                raise WriteError(f"{final}: {tensor.name} has the wrong dtype or shape; nothing deleted")
            pos = header.data_start + entry.begin
            for piece in tensor_pieces(tensor.source, layouts[tensor.source.fqn], files, tensor.dtype):
                for expected, n in _piece_blocks(piece):
                    got = pread_exact(fd, n, pos, what=str(path))
                    if got != expected:
                        raise WriteError(
                            f"{final}: {tensor.name} differs from the DCP shards after writing; nothing deleted"
                        )
                    pos += n
    finally:
        os.close(fd)


def _piece_blocks(piece: Copy | memoryview) -> Iterator[tuple[bytes | memoryview, int]]:
    if isinstance(piece, Copy):
        for off in range(0, piece.length, COPY_BLOCK):
            n = min(COPY_BLOCK, piece.length - off)
            yield pread_exact(piece.fd, n, piece.offset + off, what=piece.what), n
    else:
        for off in range(0, len(piece), COPY_BLOCK):
            block = piece[off : off + COPY_BLOCK]
            yield block, len(block)
