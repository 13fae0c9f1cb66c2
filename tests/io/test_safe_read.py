"""The one JSON reading policy: every small JSON file is read through ``read_json_file``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpt_tools.errors import CheckpointError, ConfigError
from ckpt_tools.io.safe_read import read_json_file


@pytest.mark.parametrize(
    "content, message",
    [
        (b"[" * 100_000, "not valid JSON (JSON nested too deeply)"),
        (
            b'{"step": ' + b"9" * 5000 + b"}",
            "not valid JSON (integer of 5000 digits, more than 64 bits hold)",
        ),
        (b'{"step": 18446744073709551616}', "not valid JSON (integer of 20 digits, more than 64 bits hold)"),
        (b'{"step": 1,', "not valid JSON (Expecting property name enclosed in double quotes at line 1)"),
        (b"\xff\xfe{\x00", "not valid JSON (not UTF-8 text)"),
    ],
    ids=["100k-deep", "5000-digit-int", "2**64", "syntax", "not-utf8"],
)
def test_bad_content_is_one_line_naming_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "train_config.json"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        read_json_file(path)
    assert str(err.value) == f"{path}: {message}"


def test_what_cannot_be_read_is_unreadable(tmp_path: Path) -> None:
    fifo = tmp_path / "scheduler_state.json"
    os.mkfifo(fifo)  # opening a FIFO for reading would block forever
    with pytest.raises(CheckpointError, match=r"scheduler_state\.json: unreadable \(not a regular file \(a FIFO"):
        read_json_file(fifo)
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(CheckpointError, match=r"dir\.json: unreadable \(not a regular file \(a directory"):
        read_json_file(tmp_path / "dir.json")


def test_missing_file_label_object_and_error_class_are_the_callers(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"a\.json: missing \(every checkpoint has one\)$"):
        read_json_file(tmp_path / "a.json", missing="missing (every checkpoint has one)")
    listed = tmp_path / "b.json"
    listed.write_text("[1, 2]")
    assert read_json_file(listed) == [1, 2]
    with pytest.raises(ConfigError, match=r"^--config_path=x: expected a JSON object, not list$"):
        read_json_file(listed, label="--config_path=x", want_object=True, error=ConfigError)
