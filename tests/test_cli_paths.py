"""Paths the file system refuses, and empty ones, are one line and an exit code in every command.

An empty argument becomes ``Path(".")`` - the current directory - so ``push ""`` published
whatever run the working directory held; a path component longer than the file system allows
raised ``OSError`` from the first ``stat``, a traceback in every command.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.procs import run_cli

COMMANDS = [
    ["inspect"],
    ["verify-resume"],
    ["reshard-plan", "--nproc", "1"],
    ["convert-dcp"],
    ["push", "--repo-id", "alice/policy"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_an_empty_path_is_refused_not_taken_as_the_current_directory(command: list[str], tmp_path: Path) -> None:
    proc = run_cli(command[0], "", *command[1:], cwd=tmp_path, no_torch=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: an empty argument: name the path (or value) explicitly, e.g. . for this directory"
    ]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_name_longer_than_the_file_system_allows_is_one_line(command: list[str], tmp_path: Path) -> None:
    proc = run_cli(command[0], str(tmp_path / ("a" * 300)), *command[1:], no_torch=True)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "name too long" in lines[0], proc.stderr
