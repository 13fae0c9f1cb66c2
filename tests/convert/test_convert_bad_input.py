"""Broken and hostile DCP checkpoints: one clear line, a non-zero exit, nothing written, nothing run.

Every case starts from a copy of a checkpoint torch wrote, damages it the way a crash, a
bad copy or an attacker would, and runs the CLI (in-process through the same Typer app;
as a real process for a code-running pickle and a full disk). Each must end with exactly one
``error:`` line on stderr (no traceback), the documented exit code, no output file or
temporary left behind, and the source files exactly as they were.
"""

from __future__ import annotations

import io
import os
import pickle
import resource
import signal
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devtools.procs import REPO, run_cli
from tests.support.cli import invoke_cli
from tests.support.dcp_fixtures import (
    FSDP2_STEP,
    FSDP3_DCP,
    copy_tree,
    rewrite_metadata,
    tree_digest,
)


class RunSystem:
    """Pickles to ``posix.system(command)``: what a hostile checkpoint would carry."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def hostile_archive(payload: bytes) -> bytes:
    """A torch.save-shaped zip archive whose data.pkl is ``payload``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", payload)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", b"\0" * 16)
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


def point_item_at_appended_bytes(dcp: Path, fqn: str, data: bytes) -> None:
    """Append ``data`` to a shard file and make ``fqn``'s (first) storage entry point at it."""
    shard = dcp / "__0_0.distcp"
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(data)

    def edit(md: Any) -> None:
        for key, info in md.storage_data.items():
            if key.fqn == fqn:
                info.relative_path, info.offset, info.length = shard.name, offset, len(data)
                return
        raise AssertionError(f"{fqn} not in storage_data")

    rewrite_metadata(dcp, edit)


def run_convert(*args: str, limit_file_size: int | None = None) -> subprocess.CompletedProcess[str]:
    """``convert-dcp ARGS`` in-process; a real process when it needs a file-size limit (a "full disk")."""
    if limit_file_size is None:
        return invoke_cli("convert-dcp", *args)

    def limit() -> None:
        # A "full disk" without root: writes past this size fail with EFBIG instead of killing us.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_size, limit_file_size))

    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tools.cli", "convert-dcp", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
        preexec_fn=limit,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def assert_nothing_written(out: Path) -> None:
    assert not out.exists() or not any(out.iterdir()), sorted(p.name for p in out.iterdir())


def _truncate_shard(dcp: Path) -> None:
    shard = dcp / "__1_0.distcp"
    os.truncate(shard, shard.stat().st_size // 2)


def _span_past_eof(dcp: Path) -> None:
    def edit(md: Any) -> None:
        info = next(v for k, v in md.storage_data.items() if k.fqn == "model.w")
        info.length += 1_000_000

    rewrite_metadata(dcp, edit)


def _dotdot_path(dcp: Path) -> None:
    (dcp.parent / "__0_0.distcp").write_bytes((dcp / "__0_0.distcp").read_bytes())

    def edit(md: Any) -> None:
        for info in md.storage_data.values():
            if info.relative_path == "__0_0.distcp":
                info.relative_path = "../__0_0.distcp"

    rewrite_metadata(dcp, edit)


def _absolute_path(dcp: Path) -> None:
    def edit(md: Any) -> None:
        for info in md.storage_data.values():
            info.relative_path = str(dcp / info.relative_path)

    rewrite_metadata(dcp, edit)


def _symlink_escape(dcp: Path) -> None:
    outside = dcp.parent / "elsewhere.distcp"
    outside.write_bytes((dcp / "__0_0.distcp").read_bytes())
    (dcp / "__0_0.distcp").unlink()
    (dcp / "__0_0.distcp").symlink_to(outside)


def _overlap(dcp: Path) -> None:
    from torch.distributed.checkpoint.metadata import MetadataIndex

    def edit(md: Any) -> None:
        chunks = md.state_dict_metadata["model.w"].chunks  # rows [0,4) [4,8) [8,10)
        moved = chunks[1]
        old = MetadataIndex("model.w", moved.offsets)
        moved.offsets = type(moved.offsets)((3, 0))  # now [3,7): overlaps the first chunk
        info = md.storage_data.pop(old)
        md.storage_data[MetadataIndex("model.w", moved.offsets)] = info

    rewrite_metadata(dcp, edit)


def _missing_chunk(dcp: Path) -> None:
    def edit(md: Any) -> None:
        md.state_dict_metadata["model.w"].chunks.pop()

    rewrite_metadata(dcp, edit)


def _unknown_dtype(dcp: Path) -> None:
    import torch

    def edit(md: Any) -> None:
        md.state_dict_metadata["model.w"].properties.dtype = torch.complex64

    rewrite_metadata(dcp, edit)


def _not_a_metadata_pickle(dcp: Path) -> None:
    (dcp / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": "nope"}))


def _garbage_metadata(dcp: Path) -> None:
    (dcp / ".metadata").write_bytes(b"\x80\x04this is not a pickle")


CASES: dict[str, tuple[Callable[[Path], None], int, tuple[str, ...]]] = {
    "missing .metadata": (lambda d: (d / ".metadata").unlink(), 3, (".metadata", "missing")),
    "truncated .distcp": (_truncate_shard, 3, ("__1_0.distcp", "truncated")),
    "chunk span past end of file": (_span_past_eof, 3, ("model.w", "past the end", "truncated")),
    "relative path with ..": (_dotdot_path, 3, ("../__0_0.distcp", "leaves the checkpoint directory")),
    "absolute path": (_absolute_path, 3, ("leaves the checkpoint directory",)),
    "symlink escape": (_symlink_escape, 3, ("symlink", "outside")),
    "overlapping chunks": (_overlap, 3, ("model.w", "overlap")),
    "missing chunk": (_missing_chunk, 3, ("model.w", "cover 32 of 40 elements")),
    "dtype differs from the chunks": (_unknown_dtype, 3, ("model.w", "holds float32", ".metadata says complex64")),
    "not DCP metadata": (_not_a_metadata_pickle, 3, ("not a DCP Metadata",)),
    "garbage .metadata": (_garbage_metadata, 3, ("not a valid pickle",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_cleanly(ckpts: Path, tmp_path: Path, case: str) -> None:
    damage, code, needles = CASES[case]
    dcp = copy_tree(ckpts / FSDP3_DCP, tmp_path / "ckpt" / "pytorch_model_fsdp_0")
    damage(dcp)
    before = tree_digest(tmp_path / "ckpt")
    out = tmp_path / "out"
    assert_one_line_error(run_convert(str(dcp), "--output", str(out)), code, *needles)
    assert_nothing_written(out)
    assert tree_digest(tmp_path / "ckpt") == before


def test_metadata_that_calls_os_system_is_refused_and_never_runs(ckpts: Path, tmp_path: Path) -> None:
    dcp = copy_tree(ckpts / FSDP3_DCP, tmp_path / "ckpt" / "pytorch_model_fsdp_0")
    sentinel = tmp_path / "PWNED"
    (dcp / ".metadata").write_bytes(pickle.dumps(RunSystem(f"touch {sentinel}")))
    # A real process: the one-line contract end to end.
    proc = run_cli("convert-dcp", str(dcp), "--output", str(tmp_path / "out"))
    assert_one_line_error(proc, 3, "refused to load global posix.system")
    assert not sentinel.exists()
    assert_nothing_written(tmp_path / "out")
    # inspect reports it as a failed health check (exit 1) - and does not run it either.
    proc = run_cli("inspect", str(dcp))
    assert proc.returncode == 1 and "refused to load global posix.system" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr
    assert not sentinel.exists()


def test_chunk_pickle_that_calls_os_system_is_refused_and_never_runs(ckpts: Path, tmp_path: Path) -> None:
    dcp = copy_tree(ckpts / FSDP3_DCP, tmp_path / "ckpt" / "pytorch_model_fsdp_0")
    sentinel = tmp_path / "PWNED"
    point_item_at_appended_bytes(dcp, "model.scale", hostile_archive(pickle.dumps(RunSystem(f"touch {sentinel}"))))
    before = tree_digest(dcp)
    proc = run_convert(str(dcp), "--output", str(tmp_path / "out"))
    assert_one_line_error(proc, 3, "refused to load global posix.system")
    assert not sentinel.exists()
    assert_nothing_written(tmp_path / "out")
    assert tree_digest(dcp) == before


def test_hostile_optimizer_item_is_skipped_with_a_note_not_run(ckpts: Path, tmp_path: Path) -> None:
    import json

    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "step")
    dcp = step / "training_state" / "optimizer_0"
    sentinel = tmp_path / "PWNED"
    payload = hostile_archive(pickle.dumps(RunSystem(f"touch {sentinel}")))
    point_item_at_appended_bytes(dcp, "optimizer.param_groups.0.lr", payload)
    proc = run_convert(str(step), "--what", "optimizer", "--output", str(tmp_path / "out"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert not sentinel.exists()
    notes = json.loads(proc.stdout)["notes"]
    assert any("optimizer.param_groups.0.lr" in n and "posix.system" in n for n in notes), notes
    assert (tmp_path / "out" / "optimizer_state_flat.safetensors").is_file()


def test_full_disk_leaves_no_partial_output(ckpts: Path, tmp_path: Path) -> None:
    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "step")  # ~10 MB of weights
    before = tree_digest(step)
    out = tmp_path / "out"
    proc = run_convert(str(step), "--output", str(out), limit_file_size=2 * 2**20)
    assert_one_line_error(proc, 4, "file too large")
    assert_nothing_written(out)
    assert tree_digest(step) == before


def test_delete_dcp_keeps_the_shards_when_the_write_fails(ckpts: Path, tmp_path: Path) -> None:
    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "step")
    before = tree_digest(step)
    proc = run_convert(str(step), "--delete-dcp", limit_file_size=2 * 2**20)
    assert_one_line_error(proc, 4, "model.safetensors")
    assert tree_digest(step) == before  # shards intact, no model.safetensors, no temporaries


def test_usage_errors_name_the_flag(ckpts: Path, tmp_path: Path) -> None:
    dcp = ckpts / FSDP3_DCP
    assert_one_line_error(run_convert(str(dcp), "--dtype", "int8"), 2, "--dtype")
    assert_one_line_error(run_convert(str(dcp), "--max-shard-size", "lots"), 2, "--max-shard-size")
    assert_one_line_error(run_convert(str(dcp), "--what", "everything"), 2, "--what")
    assert_one_line_error(run_convert(str(tmp_path / "nope")), 3, "no such file")
    assert not any(tmp_path.iterdir())
