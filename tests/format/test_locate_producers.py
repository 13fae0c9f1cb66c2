"""``locate`` classifies what other producers write: safetensors folders, rank-local DCP, an index file."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_tools.errors import CheckpointError
from ckpt_tools.format import layout as L
from tests.support.producers import HF_DISTRIBUTED, HF_FULL, RANK_LOCAL_DCP


def test_a_folder_of_safetensors_is_a_checkpoint() -> None:
    for folder in (HF_FULL, HF_DISTRIBUTED):
        assert L.locate(folder).kind is L.PathKind.SAFETENSORS_DIR
    index = L.locate(HF_FULL / "model.safetensors.index.json")
    assert (index.kind, index.path) == (L.PathKind.SAFETENSORS_DIR, HF_FULL)


def test_rank_local_dcp_and_its_metadata_files() -> None:
    assert L.locate(RANK_LOCAL_DCP).kind is L.PathKind.DCP_DIR
    located = L.locate(RANK_LOCAL_DCP / "__1.metadata")
    assert (located.kind, located.path) == (L.PathKind.DCP_DIR, RANK_LOCAL_DCP)


def test_an_empty_folder_is_still_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CheckpointError, match=r"not a checkpoint \(no pretrained_model/.*\*\.safetensors"):
        L.locate(tmp_path)
