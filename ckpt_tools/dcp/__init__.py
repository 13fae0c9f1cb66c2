"""Torch-free reading of ``torch.distributed.checkpoint`` (DCP) directories.

- :mod:`~ckpt_tools.dcp.metadata`: ``.metadata`` through a restricted unpickler;
- :mod:`~ckpt_tools.dcp.index`: the chunk index, what ``.metadata`` says is where;
- :mod:`~ckpt_tools.dcp.validate`: whether the directory holds what ``.metadata`` says (every reader's check);
- :mod:`~ckpt_tools.dcp.reader`: one chunk's torch.save archive, headers only;
- :mod:`~ckpt_tools.dcp.zipblob`: the zip members inside a span of a shard file;
- :mod:`~ckpt_tools.dcp.assemble` / :mod:`~ckpt_tools.dcp.casting`: chunks into a tensor's bytes, cast on the way.
"""

from ckpt_tools.dcp.index import BytesEntry, Chunk, ChunkIndex, RankShard, TensorEntry
from ckpt_tools.dcp.metadata import DcpMetadata, load_metadata
from ckpt_tools.dcp.reader import ChunkLayout, read_chunk_layout
from ckpt_tools.dcp.validate import Problem

__all__ = [
    "BytesEntry",
    "Chunk",
    "ChunkIndex",
    "ChunkLayout",
    "DcpMetadata",
    "Problem",
    "RankShard",
    "TensorEntry",
    "load_metadata",
    "read_chunk_layout",
]
