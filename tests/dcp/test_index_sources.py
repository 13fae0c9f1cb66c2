"""The save's index and the cache: used when they are sound and bound to this ``.metadata``, never else.

Each test writes a DCP directory with torch's own ``dcp.save`` and indexes it with the
training core's own writer (:func:`ckpt_tools.train.checkpoint.save_index.write_save_index`),
then changes it the ways files really change: a re-save, an edit, an index copied from another
save, a flipped byte, a touched shard. The table a tool works from must always be the one a
fresh parse of ``.metadata`` gives.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckpt_tools.dcp import cache, index_file, sources, validate
from ckpt_tools.dcp.index import ChunkIndex, forget
from ckpt_tools.dcp.metadata import load_metadata
from ckpt_tools.format.layout import DCP_INDEX, DCP_METADATA
from ckpt_tools.train.checkpoint.save_index import write_save_index
from tests.support.dcp_damage import int32_chunk
from tests.support.tables import table_differences


def saved(directory: Path, scale: float = 1.0) -> Path:
    state = {
        "model": {
            "w": torch.arange(40, dtype=torch.float32).reshape(10, 4) * scale,
            "b": torch.ones(10) * scale,
            "step": torch.tensor(3.0),
        },
        "optim": {"param_groups": [{"lr": 0.1, "params": [0]}]},
    }
    metadata = dcp.save(state, checkpoint_id=directory, no_dist=True)
    write_save_index(directory, metadata)
    return directory


def fresh(directory: Path) -> ChunkIndex:
    forget()
    return ChunkIndex.load(directory)


def parsed(directory: Path) -> object:
    with sources.reading(index=False, cache=False):
        return load_metadata(directory)


@pytest.fixture
def dcp_dir(tmp_path: Path) -> Path:
    return saved(tmp_path / "a")


def test_the_saves_index_is_read_and_holds_what_metadata_says(dcp_dir: Path) -> None:
    index = fresh(dcp_dir)
    assert index.origin.source == "index" and index.origin.note is None
    assert table_differences(index.table, parsed(dcp_dir)) == []
    assert index.archives_known_good()  # the files are as the save wrote them
    assert validate.problems(index) == []


def test_an_index_of_another_save_is_refused(dcp_dir: Path, tmp_path: Path) -> None:
    other = saved(tmp_path / "b", scale=2.0)
    shutil.copy(other / DCP_INDEX, dcp_dir / DCP_INDEX)
    index = fresh(dcp_dir)
    assert index.origin.source == "metadata"
    assert "describes another .metadata (stale or from another save)" in (index.origin.note or "")
    assert table_differences(index.table, parsed(dcp_dir)) == []


def test_a_resave_leaves_the_old_index_stale_and_it_is_refused(dcp_dir: Path) -> None:
    stale = (dcp_dir / DCP_INDEX).read_bytes()
    state = {"model": {"w": torch.zeros(6, 4)}}  # a different save into the same directory
    dcp.save(state, checkpoint_id=dcp_dir, no_dist=True)
    (dcp_dir / DCP_INDEX).write_bytes(stale)
    index = fresh(dcp_dir)
    assert index.origin.source == "metadata" and "stale" in (index.origin.note or "")
    assert index.table.names == ["model.w"]


def test_an_edited_metadata_is_read_and_its_index_refused(dcp_dir: Path) -> None:
    data = bytearray((dcp_dir / DCP_METADATA).read_bytes())
    position = data.find(b"model.b")
    data[position : position + 7] = b"model.c"  # same size, different content
    (dcp_dir / DCP_METADATA).write_bytes(bytes(data))
    index = fresh(dcp_dir)
    assert index.origin.source == "metadata" and "model.c" in index.table.names


@pytest.mark.parametrize("where", ["header", "column", "digest"])
def test_a_damaged_index_is_refused(dcp_dir: Path, where: str) -> None:
    data = bytearray((dcp_dir / DCP_INDEX).read_bytes())
    position = {"header": 20, "column": len(data) - 40, "digest": len(data) - 1}[where]
    data[position] ^= 0x55
    (dcp_dir / DCP_INDEX).write_bytes(bytes(data))
    index = fresh(dcp_dir)
    assert index.origin.source == "metadata" and "not a sound chunk index" in (index.origin.note or "")
    assert table_differences(index.table, parsed(dcp_dir)) == []


def test_an_index_with_values_out_of_range_is_refused_even_with_a_good_digest(dcp_dir: Path) -> None:
    table, binding = index_file.read_index((dcp_dir / DCP_INDEX).read_bytes(), what="x")
    table.file = np.full_like(table.file, 7)  # a shard file the index does not list
    (dcp_dir / DCP_INDEX).write_bytes(index_file.index_bytes(table, binding))
    index = fresh(dcp_dir)
    assert index.origin.source == "metadata" and "file out of range" in (index.origin.note or "")


def test_a_shard_changed_after_the_save_has_its_archives_checked_again(dcp_dir: Path) -> None:
    assert fresh(dcp_dir).archives_known_good()
    int32_chunk(dcp_dir, "model.w")  # rewrites .metadata too: the index goes stale, the archives are read
    index = fresh(dcp_dir)
    assert not index.archives_known_good()
    (found,) = validate.problems(index)
    assert "holds int32" in found.message


def test_a_touched_shard_is_no_longer_vouched_for(dcp_dir: Path) -> None:
    shard = next(dcp_dir.glob("*.distcp"))
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    index = fresh(dcp_dir)
    assert index.origin.source == "index" and not index.archives_known_good()
    assert validate.problems(index) == []  # checked in full, and sound


# ---------------------------------------------------------------------- the cache


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(folder))
    monkeypatch.setattr(cache, "MIN_METADATA_BYTES", 0)  # these files are small; real ones are MBs
    return folder


def test_the_second_look_reads_the_cache(dcp_dir: Path, cache_dir: Path) -> None:
    (dcp_dir / DCP_INDEX).unlink()  # a checkpoint another tool wrote
    first = fresh(dcp_dir)
    assert first.origin.source == "metadata" and not first.archives_known_good()
    assert validate.problems(first) == []  # checks every archive, and remembers it
    second = fresh(dcp_dir)
    assert second.origin.source == "cache" and second.archives_known_good()
    assert table_differences(first.table, second.table) == []


def test_a_changed_metadata_misses_the_cache(dcp_dir: Path, cache_dir: Path) -> None:
    (dcp_dir / DCP_INDEX).unlink()
    fresh(dcp_dir)
    data = (dcp_dir / DCP_METADATA).read_bytes()
    (dcp_dir / DCP_METADATA).write_bytes(data)  # same bytes, new identity (times)
    assert fresh(dcp_dir).origin.source == "metadata"


def test_no_cache_reads_neither_and_writes_nothing(dcp_dir: Path, cache_dir: Path) -> None:
    with sources.reading(index=False, cache=False):
        index = fresh(dcp_dir)
    assert index.origin.source == "metadata"
    assert not cache_dir.exists() or not any(cache_dir.rglob("*.index"))


def test_a_cache_folder_others_can_write_is_not_used(dcp_dir: Path, cache_dir: Path) -> None:
    (dcp_dir / DCP_INDEX).unlink()
    fresh(dcp_dir)
    folder = cache_dir / "dcp-index"
    folder.chmod(folder.stat().st_mode | stat.S_IWOTH)
    assert cache.folder() is None
    assert fresh(dcp_dir).origin.source == "metadata"


def test_a_damaged_cache_entry_is_dropped(dcp_dir: Path, cache_dir: Path) -> None:
    (dcp_dir / DCP_INDEX).unlink()
    fresh(dcp_dir)
    (entry,) = (cache_dir / "dcp-index").glob("*.index")
    entry.write_bytes(entry.read_bytes()[:-1])
    assert fresh(dcp_dir).origin.source == "metadata"


def test_empty_shard_files_of_idle_writer_threads_are_not_unreferenced(dcp_dir: Path) -> None:
    """torch's writer creates ``__<rank>_<n>.distcp`` for every thread, empty when it got nothing."""
    (dcp_dir / "__0_3.distcp").touch()
    (dcp_dir / "__0_4.distcp").write_bytes(b"x")
    assert fresh(dcp_dir).unreferenced_files() == ["__0_4.distcp"]
