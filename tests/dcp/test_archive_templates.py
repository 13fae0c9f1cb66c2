"""Chunk archives compared against their kind's template: a swapped archive among many alike is found.

A sharded save has thousands of chunk archives of one kind (dtype, box, span length), whose
header bytes :mod:`ckpt_tools.dcp.archives` compares with the first one's instead of parsing
them. An archive overwritten in place by one of the same length but another shape must still
be named - the first one in file order, whichever file it is in.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import MetadataIndex

from ckpt_tools.dcp import validate
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.dcp.sources import reading
from devtools.reliability.fuzz_mutations import load_torch_metadata
from tests.support.dcp_damage import write_dcp

LAYERS = 12


def _swap_shape(directory: Path, fqn: str, rank_offset: int) -> str:
    """The chunk of ``fqn`` at row ``rank_offset`` overwritten in place: the same values as [2, 8], same length."""
    md = load_torch_metadata(directory)
    info = md.storage_data[MetadataIndex(fqn, torch.Size([rank_offset, 0]))]
    buf = io.BytesIO()
    torch.save(torch.zeros(2, 8), buf)
    data = buf.getvalue()
    assert len(data) == info.length  # same span: the archive is only told apart by its header bytes
    with open(directory / info.relative_path, "r+b") as f:
        f.seek(info.offset)
        f.write(data)
    return (
        f"{info.relative_path} ({fqn} chunk at [{rank_offset}, 0]): holds float32[2, 8], .metadata says float32[4, 4]"
    )


def test_the_first_swapped_archive_in_file_order_is_named(tmp_path: Path) -> None:
    directory = write_dcp(tmp_path / "dcp", {f"layer{k}.w": torch.randn(8, 4) for k in range(LAYERS)})
    with reading(cache=False):
        assert validate.problems(ChunkIndex.load(directory)) == []
    _swap_shape(directory, "layer3.w", 4)  # rank 1's file: later in file order
    expected = _swap_shape(directory, "layer9.w", 0)  # rank 0's file
    with reading(cache=False):
        found = validate.archive_problems(ChunkIndex.load(directory), full=True)
    assert [p.message for p in found] == [expected]


def test_a_cut_shard_is_named_not_misread(tmp_path: Path) -> None:
    directory = write_dcp(tmp_path / "dcp", {f"layer{k}.w": torch.randn(8, 4) for k in range(LAYERS)})
    shard = directory / "__1_0.distcp"
    with reading(cache=False):
        index = ChunkIndex.load(directory)
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 100)  # after the structure check: the last archive's tail is short
    found = validate.archive_problems(index, full=True)
    assert len(found) == 1 and "__1_0.distcp (layer11.w chunk at [4, 0])" in found[0].message
