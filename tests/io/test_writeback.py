"""Writeback started as a file grows: every stretch handed over once, in order, after it is in the kernel.

The DCP shard files written this way must be byte for byte the files torch's own writer
produces, and load back with plain ``dcp.load``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckpt_tools.io.writeback import WRITEBACK_EVERY, WritebackFile
from ckpt_tools.train.checkpoint.dcp_io import WritebackFileSystemWriter

HandOver = tuple[int, int, int]  # (offset, length, file size in the kernel at that moment)


@pytest.fixture
def hand_overs(monkeypatch: pytest.MonkeyPatch) -> list[HandOver]:
    """Records each writeback start (the real ``posix_fadvise`` still runs)."""
    real = os.posix_fadvise
    seen: list[HandOver] = []

    def recording(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_DONTNEED:
            seen.append((offset, length, os.fstat(fd).st_size))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", recording)
    return seen


def test_each_stretch_is_handed_over_once_in_order_and_only_once_written(
    tmp_path: Path, hand_overs: list[HandOver]
) -> None:
    every = 10_000
    pieces = [os.urandom(n) for n in (1, 999, 4096, 25_000, 3, 70_000, 512, 9_000, 2_000_000, 7)]
    path = tmp_path / "f"
    with WritebackFile(path, every=every) as stream:
        for piece in pieces:
            assert stream.write(piece) == len(piece)
    written = b"".join(pieces)
    assert path.read_bytes() == written

    assert hand_overs, "no writeback was started"
    expected_offset = 0
    for offset, length, size_in_kernel in hand_overs:
        assert offset == expected_offset  # contiguous, from the start, never twice
        assert length >= every
        assert size_in_kernel >= offset + length  # flushed out of our buffer before being handed over
        expected_offset += length
    assert len(written) - expected_offset < every  # only a tail shorter than one stretch is left to the fsync


def test_dcp_shards_are_the_plain_writers_bytes_and_load_back(tmp_path: Path, hand_overs: list[HandOver]) -> None:
    generator = torch.Generator().manual_seed(0)
    state = {"model": {f"w{i}": torch.randn(3 << 20, generator=generator) for i in range(4)}}  # 4 x 12 MiB
    state["model"]["bias"] = torch.arange(10, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: saving in a single process"
        dcp.save(state, storage_writer=WritebackFileSystemWriter(tmp_path / "wb", thread_count=1))
        assert len(hand_overs) >= 48 * 2**20 // WRITEBACK_EVERY
        dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path / "plain", thread_count=1))
        loaded = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
        dcp.load(loaded, checkpoint_id=tmp_path / "wb")

    shards = sorted(p.name for p in (tmp_path / "plain").glob("*.distcp"))
    assert shards == sorted(p.name for p in (tmp_path / "wb").glob("*.distcp"))
    for name in shards:
        assert (tmp_path / "wb" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()
    for key, tensor in state["model"].items():
        assert torch.equal(loaded["model"][key], tensor), key
