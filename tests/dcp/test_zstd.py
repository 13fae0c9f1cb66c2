"""torch's zstd-compressed DCP: decompressed chunk by chunk within what ``.metadata`` accounts for."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from ckpt_tools.dcp import validate
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.errors import CorruptCheckpoint
from ckpt_tools.inspect import inspect_path
from tests.support.producers import ZSTD_DCP


def _repoint(dcp: Path, fqn: str, data: bytes) -> None:
    """Put ``data`` in a new shard file and point ``fqn``'s (only) chunk at it, keeping the zstd descriptor."""
    (dcp / "__0_1.distcp").write_bytes(data)
    md = pickle.loads((dcp / ".metadata").read_bytes())
    for key, info in md.storage_data.items():
        if key.fqn == fqn:
            info.relative_path, info.offset, info.length = "__0_1.distcp", 0, len(data)
    (dcp / ".metadata").write_bytes(pickle.dumps(md))


def test_every_item_is_zstd_and_the_archives_check(tmp_path: Path) -> None:
    index = ChunkIndex.load(ZSTD_DCP)
    assert all(c.transforms == ("stream.zstd/1",) for e in index.tensors.values() for c in e.chunks)
    assert all(b.transforms == ("stream.zstd/1",) for b in index.byte_items.values())
    assert validate.problems(index) == []


def test_a_stream_that_expands_past_its_chunk_is_refused(tmp_path: Path) -> None:
    """A few KiB that would expand into 64 MiB for a [5] float32 chunk: refused at the bound, never unpacked."""
    import zstandard

    dcp = shutil.copytree(ZSTD_DCP, tmp_path / "model")
    _repoint(dcp, "model.head.bias", zstandard.ZstdCompressor().compress(bytes(64 * 2**20)))
    found = validate.problems(ChunkIndex.load(dcp))
    assert found and "expands beyond" in found[0].message, found
    report = inspect_path(dcp)
    assert not report.healthy


def test_a_stream_that_is_not_zstd_is_a_clear_problem(tmp_path: Path) -> None:
    dcp = shutil.copytree(ZSTD_DCP, tmp_path / "model")
    _repoint(dcp, "model.head.bias", b"this is not zstd at all")
    with pytest.raises(CorruptCheckpoint, match="not a valid zstd stream"):
        validate.require_valid(validate.problems(ChunkIndex.load(dcp)))
