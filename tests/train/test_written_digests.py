"""The full digests come from the writers, as they write, and match the bytes on disk.

In one process, without a process group: the DCP writer digests each shard file it streams
(and stamps ``.metadata``), the gathered writer digests each range it ``pwrite``s, and the
commit's merge turns one rank's dump into the record's entries. The multi-rank case is the
session's ``runs`` (``tests/format/test_save_data.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ckpt_tools.facts import save_stamps
from ckpt_tools.io import digest
from ckpt_tools.train.checkpoint.dcp_io import dcp_save
from ckpt_tools.train.checkpoint.gathered_write import RowWriter, write_gathered
from ckpt_tools.train.checkpoint.written_digests import DIR, WrittenDigests, merged


def test_the_dcp_writer_digests_each_shard_file_and_stamps_the_metadata(tmp_path: Path) -> None:
    written = WrittenDigests(tmp_path)
    directory = tmp_path / "pytorch_model_fsdp_0"
    dcp_save({"model": {"w": torch.randn(300, 40), "b": torch.randn(7)}}, directory, None, written, "5f0c" * 8)
    dumped = merged_of(written, tmp_path)
    shards = sorted(p.name for p in directory.glob("*.distcp"))
    assert shards and sorted(Path(rel).name for rel in dumped) == shards  # .metadata: the commit's to digest
    for rel, entry in dumped.items():
        assert (entry["size"], entry["whole"]) == digest.of_file(tmp_path / rel), rel
    assert save_stamps.dcp_stamped_id(directory) == "5f0c" * 8
    assert written.seconds > 0


def test_the_gathered_writer_digests_each_range_it_writes(tmp_path: Path) -> None:
    written = WrittenDigests(tmp_path)
    path = tmp_path / "model.safetensors"
    state = {"a": torch.randn(3, 4), "b": torch.randn(5), "c": torch.zeros(0)}
    write_gathered(state, path, RowWriter(is_main=True), lambda: None, {"format": "pt", "save_id": "x"}, written)
    entry = merged_of(written, tmp_path)["model.safetensors"]
    assert entry["size"] == path.stat().st_size and len(entry["pieces"]) == 3  # header, a, b (c has no bytes)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert all(digest.of_range(fd, o, n) == (d, n) for o, n, d in entry["pieces"])
    finally:
        os.close(fd)
    assert save_stamps.stamped_id(path) == "x"


def merged_of(written: WrittenDigests, root: Path) -> dict[str, dict[str, object]]:
    written.dump(0)
    out = merged(root)
    assert not (root / DIR).exists()  # the commit leaves no trace of the hand-over
    return out
