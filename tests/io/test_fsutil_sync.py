"""Files written for a checkpoint commit are fsynced once, by the commit's ``fsync_tree``.

A save writes its sidecar files into the hidden partial directory that the commit fsyncs
as a whole before the rename; fsyncing each of them on its own as well cost a disk flush per
file inside the loop's pause. ``sync_deferred`` leaves that to the commit - on its own
thread only, so the loop's other writes keep their own fsync while a background save runs.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ckpt_tools.io.fsutil import fsync_tree, sync_deferred, write_json_atomic
from ckpt_tools.st.writer import StreamingWriter, TensorToWrite


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths every os.fsync call flushed (the call still happens)."""
    paths: list[str] = []
    real = os.fsync

    def recording(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return paths


def write_files(directory: Path) -> None:
    write_json_atomic(directory / "train_config.json", {"steps": 3})
    writer = StreamingWriter(directory / "rng_state.safetensors", [TensorToWrite("x", "U8", (4,), 4)], {})
    writer.open()
    writer.begin("x")
    writer.write(memoryview(b"\x01\x02\x03\x04"))
    writer.end()
    writer.finish()
    writer.commit()


def test_deferred_files_are_fsynced_once_by_the_tree_sync(tmp_path: Path, fsynced: list[str]) -> None:
    partial = tmp_path / ".000003.partial"
    partial.mkdir()
    with sync_deferred():
        write_files(partial)
    assert fsynced == []
    fsync_tree(partial)
    files = sorted(p for p in fsynced if not os.path.isdir(p))
    assert files == sorted(str(partial / n) for n in ("rng_state.safetensors", "train_config.json"))


def test_outside_the_deferral_and_on_other_threads_every_file_is_fsynced(tmp_path: Path, fsynced: list[str]) -> None:
    write_files(tmp_path)
    assert len([p for p in fsynced if not os.path.isdir(p)]) == 2
    fsynced.clear()
    other = tmp_path / "other"
    other.mkdir()
    with sync_deferred():  # deferral on this thread only
        thread = threading.Thread(target=write_files, args=(other,))
        thread.start()
        thread.join()
    assert len([p for p in fsynced if not os.path.isdir(p)]) == 2


def test_the_commit_fsyncs_what_no_writer_did_and_every_directory(tmp_path: Path, fsynced: list[str]) -> None:
    """DCP shards and the gathered weights were fsynced by the ranks that wrote them; not again."""
    from ckpt_tools.train.checkpoint.save_job import commit

    root = tmp_path / "checkpoints"
    partial = root / ".000003.partial"
    model_dcp = partial / "pretrained_model" / "pytorch_model_fsdp_0"
    optimizer_dcp = partial / "training_state" / "optimizer_0"
    synced_by_writers = [
        model_dcp / "__0_0.distcp",
        model_dcp / "__1_0.distcp",
        optimizer_dcp / "__0_0.distcp",
        partial / "pretrained_model" / "model.safetensors",
    ]
    deferred = [
        model_dcp / ".metadata",  # torch fsyncs it before flushing it: the commit must
        optimizer_dcp / ".metadata",
        partial / "pretrained_model" / "config.json",
        partial / "training_state" / "rng_state.safetensors",
        partial / "training_state" / "optimizer_state.safetensors",  # a non-sharded run's flat optimizer
        partial / "training_step.json",
    ]
    for path in synced_by_writers + deferred:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")

    commit(partial, root / "000003", root)

    def now(synced: str) -> str:  # where a path fsynced inside the partial dir lives after the rename
        return synced.replace(str(partial), str(root / "000003"))

    files = sorted(p for p in fsynced if not os.path.isdir(now(p)))
    record = partial / "training_state" / "save_files.json"  # the commit's own record of the save's files
    assert files == sorted([str(p) for p in deferred] + [str(record)])
    directories = {p for p in fsynced if os.path.isdir(now(p))}
    for directory in (partial, model_dcp, optimizer_dcp, partial / "pretrained_model", partial / "training_state"):
        assert str(directory) in directories, directory
    assert (root / "last").resolve() == root / "000003"
