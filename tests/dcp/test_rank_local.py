"""Rank-local DCP metadata (``dcp.save(..., use_collectives=False)``): read as the union of the ranks' files."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.errors import CheckpointError, CorruptCheckpoint
from tests.support.producers import RANK_LOCAL_DCP


def test_each_chunk_is_kept_once_from_the_lowest_rank() -> None:
    index = ChunkIndex.load(RANK_LOCAL_DCP)
    assert index.table.rank_local == ("__0.metadata", "__1.metadata")
    # plain tensors are in both ranks' files: rank 0's copy is read; the sharded one is half in each
    assert {c.file for c in index.tensors["model.embed.weight"].chunks} == {"__0_0.distcp"}
    assert [c.file for c in index.tensors["model.sharded.weight"].chunks] == ["__0_0.distcp", "__1_0.distcp"]


def test_ranks_that_disagree_on_a_tensor_are_refused(tmp_path: Path) -> None:
    import torch

    dcp = shutil.copytree(RANK_LOCAL_DCP, tmp_path / "model")
    md = pickle.loads((dcp / "__1.metadata").read_bytes())
    md.state_dict_metadata["model.sharded.weight"].size = torch.Size([8, 4])
    (dcp / "__1.metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(CorruptCheckpoint, match=r"__1\.metadata: 'model\.sharded\.weight' is float32\[8, 4\]"):
        ChunkIndex.load(dcp)


def test_without_any_metadata_the_save_did_not_complete(tmp_path: Path) -> None:
    dcp = shutil.copytree(RANK_LOCAL_DCP, tmp_path / "model")
    for f in dcp.glob("__*.metadata"):
        f.unlink()
    with pytest.raises(CheckpointError, match="did not complete"):
        ChunkIndex.load(dcp)
