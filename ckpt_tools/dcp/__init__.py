"""Torch-free reading of ``torch.distributed.checkpoint`` (DCP) directories.

- :mod:`~ckpt_tools.dcp.metadata`: ``.metadata`` through a restricted unpickler (or C's, isolated: :mod:`~ckpt_tools.dcp.isolated`);
- :mod:`~ckpt_tools.dcp.table`: what ``.metadata`` says, as columns (one row per chunk);
- :mod:`~ckpt_tools.dcp.index_file` / :mod:`~ckpt_tools.dcp.cache` / :mod:`~ckpt_tools.dcp.sources`:
  that table saved beside ``.metadata`` by the trainer, kept in the user's cache, and which one is read;
- :mod:`~ckpt_tools.dcp.index`: the chunk index, what ``.metadata`` says is where;
- :mod:`~ckpt_tools.dcp.validate`: whether the directory holds what ``.metadata`` says (every reader's check);
- :mod:`~ckpt_tools.dcp.reader` / :mod:`~ckpt_tools.dcp.archives`: one chunk's torch.save archive, headers only; all of them, fast;
- :mod:`~ckpt_tools.dcp.zipblob`: the zip members inside a span of a shard file;
- :mod:`~ckpt_tools.dcp.assemble` / :mod:`~ckpt_tools.dcp.casting`: chunks into a tensor's bytes, cast on the way.
"""

from ckpt_tools.dcp.index import BytesEntry, Chunk, ChunkIndex, RankShard, TensorEntry
from ckpt_tools.dcp.metadata import load_metadata
from ckpt_tools.dcp.reader import ChunkLayout, read_chunk_layout
from ckpt_tools.dcp.table import ByteItem, ChunkTable
from ckpt_tools.dcp.validate import Problem

__all__ = [
    "ByteItem",
    "BytesEntry",
    "Chunk",
    "ChunkIndex",
    "ChunkLayout",
    "ChunkTable",
    "Problem",
    "RankShard",
    "TensorEntry",
    "load_metadata",
    "read_chunk_layout",
]
