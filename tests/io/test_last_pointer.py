"""``last`` as a pointer file: written atomically where symlinks are refused, read by every tool, and a
hostile one refused in one line (in-process; the trainer's own use is in tests/train/test_retention.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ckpt_tools.errors import CheckpointError
from ckpt_tools.format import layout
from ckpt_tools.io.fsutil import find_leftovers, replace_link_or_pointer
from tests.support.cli import invoke_cli


def checkpoints(tmp_path: Path, *steps: str) -> Path:
    root = tmp_path / "run" / layout.CHECKPOINTS_DIR
    for name in steps:
        (root / name / layout.TRAINING_STATE_DIR).mkdir(parents=True)
    return root


def test_a_pointer_file_resolves_like_the_symlink(tmp_path: Path) -> None:
    root = checkpoints(tmp_path, "000002", "000004")
    assert replace_link_or_pointer(root / "last", "000004", pointer_file=True) is True
    assert (root / "last").read_text() == "000004\n"
    assert layout.resolve_last(root) == root / "000004"
    assert layout.resolve_step(root / "last").root == root / "000004"
    assert layout.resolve_step(root.parent).root == root / "000004"
    # Back to a symlink, and to a pointer again: each is one rename over the other, no temporary left.
    assert replace_link_or_pointer(root / "last", "000002") is False
    assert (root / "last").is_symlink() and layout.resolve_last(root) == (root / "000002").resolve()
    replace_link_or_pointer(root / "last", "000004", pointer_file=True)
    assert layout.last_is_pointer_file(root) and layout.resolve_last(root) == root / "000004"
    assert find_leftovers(root) == []


@pytest.mark.parametrize("refusal", [errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS])
def test_a_file_system_refusing_symlinks_gets_the_pointer_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: int
) -> None:
    root = checkpoints(tmp_path, "000001")

    def refuse(*_: object, **__: object) -> None:  # what a Windows share or an object-store mount answers
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(os, "symlink", refuse)
    assert replace_link_or_pointer(root / "last", "000001") is True
    assert layout.resolve_last(root) == root / "000001"


def test_any_other_symlink_failure_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = checkpoints(tmp_path, "000001")

    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "symlink", full)
    with pytest.raises(OSError):
        replace_link_or_pointer(root / "last", "000001")
    assert not (root / "last").exists()


HOSTILE = {
    "parent": "../../etc",
    "absolute": "/etc",
    "separator": "000001/../000001",
    "not a step": "pretrained_model",
    "huge": "0" * 100_000,
    "binary": "\x1b[2K\x00",
}


@pytest.mark.parametrize("content", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_pointer_is_refused_in_one_line_by_every_reader(tmp_path: Path, content: str) -> None:
    root = checkpoints(tmp_path, "000001")
    (root / "last").write_text(content)
    with pytest.raises(CheckpointError, match="not a 'last' pointer"):
        layout.resolve_last(root)
    for args in (
        ["verify-resume", str(root / "last"), "--skip-build"],
        ["reshard-plan", str(root.parent), "--nproc", "1"],
        ["convert-dcp", str(root / "last"), "--dry-run"],
        ["push", str(root.parent), "--repo-id", "alice/x"],
        ["prune", str(root.parent), "--keep-last", "1"],
    ):
        out = invoke_cli(*args)
        assert out.returncode == 3, (args, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "not a 'last' pointer" in lines[0] and "\x1b" not in lines[0], (args, lines)
        assert "/etc" not in out.stdout
    inspected = invoke_cli("inspect", str(root))
    assert inspected.returncode == 1
    assert "FAIL last link" in inspected.stdout and "not a 'last' pointer" in inspected.stdout


def test_a_pointer_to_a_missing_step_is_no_usable_last(tmp_path: Path) -> None:
    root = checkpoints(tmp_path, "000001")
    (root / "last").write_text("000009\n")
    assert layout.resolve_last(root) is None
    out = invoke_cli("verify-resume", str(root / "last"), "--skip-build")
    assert out.returncode == 3 and "000009, which is no step directory here" in out.stderr
