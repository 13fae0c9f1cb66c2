"""Strings read from checkpoints reach the terminal escaped: never obeyed, never a crash.

Every fixture here is a real file with hostile strings where a checkpoint holds names: tensor
names in a safetensors header (written by the safetensors library, and one by hand where the
library refuses a lone surrogate), a JSON string of ``train_config.json`` holding ``\\udc80``,
and directory names with an escape sequence, a carriage return, a bidi override and a
non-UTF-8 byte. Each command's human output must hold no raw control character (only the
newlines that end its own lines), show the hostile parts escaped, keep non-ASCII letters,
and exit with the documented code; its ``--json`` output must parse and give every string
back exactly.
"""

from __future__ import annotations

import ast
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from devtools.procs import REPO
from tests.support.cli import invoke_cli
from tests.support.lerobot_fixtures import main_run
from tests.support.run_copy import copy_run

# What a terminal obeys (every C0 but the newline ending our own lines, DEL, C1, separators,
# bidi controls) or what no encoding can write (surrogates): none may reach the output raw.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")

ERASE = "a\x1b[2K\r  ok  x"  # erases its line and prints a fake check
OVERRIDE = "\u202eevil"  # turns the rest of the line around
LETTERS = "na\u00efve"  # a non-ASCII name: stays readable
SURROGATE = "w\udc80"  # json.loads("\\udc80") gives it; UTF-8 cannot encode it
# A directory name: an erase, a fake verdict on a line of its own, an override, a non-UTF-8 byte (b"\x80").
HOSTILE_DIR = "run\x1b[2K\r\nhealthy\u202e\udc80"
ROOT = "data\udc80\x1b[2K\r  PASS  dataset\u202e"  # train_config.json's dataset.root


def assert_shown(proc: subprocess.CompletedProcess[str], code: int, *escaped: str) -> None:
    """The human output of ``proc``: the documented ``code``, nothing raw, no traceback, ``escaped`` shown."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out
    assert "Traceback" not in out, out
    assert not RAW.search(out), [line for line in out.splitlines() if RAW.search(line)]
    for text in escaped:
        assert text in out, out


def parsed(proc: subprocess.CompletedProcess[str], code: int) -> Any:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert not RAW.search(proc.stdout)  # json.dumps escapes them itself
    return json.loads(proc.stdout)


def test_printable_escapes_what_a_terminal_obeys_and_nothing_else() -> None:
    from ckpt_tools.cli.untrusted import printable

    hostile = "\x00\x07\t\n\r\x1b\x7f\x85\x9b\u2028\u2029\u202a\u202e\u2066\u2069\udc80\ud800"
    shown = printable(hostile)
    assert shown == "\\x00\\x07\\t\\n\\r\\x1b\\x7f\\x85\\x9b\\u2028\\u2029\\u202a\\u202e\\u2066\\u2069\\udc80\\ud800"
    assert printable(shown) == shown  # idempotent: a table escapes its cells, echo the line again
    kept = "na\u00efve \u65e5\u672c \u00a0 \u200f C:\\x1b \U0001f600"
    assert printable(kept) == kept


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``hostile.safetensors`` (the safetensors library's) and ``surrogate.safetensors`` (by hand)."""
    root = tmp_path_factory.mktemp("untrusted-files")
    names = (ERASE, OVERRIDE, LETTERS)
    save_file({name: np.full(i + 1, i, np.float32) for i, name in enumerate(names)}, str(root / "hostile.safetensors"))
    # The library will not encode a lone surrogate; a header written by hand holds it JSON-escaped.
    header = json.dumps({SURROGATE: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    header += b" " * (-len(header) % 8)
    (root / "surrogate.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LeRobot runs copied under :data:`HOSTILE_DIR`: ``single`` with :data:`ROOT` as its dataset root, ``fsdp-dcp``."""
    parent = tmp_path_factory.mktemp("untrusted-runs") / HOSTILE_DIR
    parent.mkdir()
    single = copy_run(main_run("single"), parent / "single")
    for config in single.glob("checkpoints/0*/pretrained_model/train_config.json"):
        doc = json.loads(config.read_text())
        doc["dataset"]["root"] = ROOT
        config.write_text(json.dumps(doc))  # ensure_ascii: the file holds "\udc80" as JSON writes it
    assert "\\udc80" in config.read_text()
    copy_run(main_run("fsdp-dcp"), parent / "fsdp-dcp")
    return parent


def test_inspect_escapes_tensor_names(files: Path) -> None:
    proc = invoke_cli("inspect", str(files / "hostile.safetensors"), "--tensors")
    assert_shown(proc, 0, "a\\x1b[2K\\r  ok  x", "\\u202eevil", LETTERS)
    assert not any(line.startswith("  ok  x") for line in proc.stdout.splitlines())
    report = parsed(invoke_cli("inspect", str(files / "hostile.safetensors"), "--tensors", "--json"), 0)
    assert {t["name"] for t in report["tensors"]} == {ERASE, OVERRIDE, LETTERS}


def test_inspect_shows_a_lone_surrogate_instead_of_crashing(files: Path) -> None:
    proc = invoke_cli("inspect", str(files / "surrogate.safetensors"), "--tensors")
    assert_shown(proc, 0, "w\\udc80")
    report = parsed(invoke_cli("inspect", str(files / "surrogate.safetensors"), "--tensors", "--json"), 0)
    assert [t["name"] for t in report["tensors"]] == [SURROGATE]


def test_inspect_escapes_the_directory_name(runs: Path) -> None:
    proc = invoke_cli("inspect", str(runs / "single" / "checkpoints"))
    assert_shown(proc, 0, "run\\x1b[2K\\r\\nhealthy\\u202e\\udc80")
    assert proc.stdout.splitlines()[-1] == "healthy"  # the verdict, and the only line saying it
    assert sum(line == "healthy" for line in proc.stdout.splitlines()) == 1
    assert parsed(invoke_cli("inspect", str(runs / "single" / "checkpoints"), "--json"), 0)["healthy"] is True


@pytest.mark.parametrize(
    "command",
    [("verify-resume",), ("reshard-plan", "--nproc", "1")],
    ids=["verify-resume", "reshard-plan"],
)
def test_resume_commands_escape_json_strings(runs: Path, command: tuple[str, ...]) -> None:
    """The saved dataset root cannot be found: exit 1, its check line shows the root escaped."""
    args = (command[0], str(runs / "single" / "checkpoints"), *command[1:])
    proc = invoke_cli(*args)
    assert_shown(proc, 1, "data\\udc80\\x1b[2K\\r  PASS  dataset\\u202e", "\\x1b[2K\\r\\nhealthy")
    report = parsed(invoke_cli(*args, "--json"), 1)
    checks = report["checks"] if "checks" in report else report["blockers"]
    assert any(ROOT in c["message"] for c in checks), checks


def test_convert_dry_run_escapes_paths(runs: Path) -> None:
    step = runs / "fsdp-dcp" / "checkpoints" / "last"
    proc = invoke_cli("convert-dcp", str(step), "--dry-run")
    assert_shown(proc, 0, "Dry run", "run\\x1b[2K\\r\\nhealthy\\u202e\\udc80")
    result = parsed(invoke_cli("convert-dcp", str(step), "--dry-run", "--json"), 0)
    assert HOSTILE_DIR in result["plan"]["dcp_dir"]


def test_the_error_line_escapes_paths(runs: Path) -> None:
    """convert-dcp on a checkpoint without DCP shards: one error line on stderr, exit 3, the path escaped."""
    proc = invoke_cli("convert-dcp", str(runs / "single" / "checkpoints" / "last"), "--dry-run")
    assert_shown(proc, 3, "run\\x1b[2K\\r\\nhealthy\\u202e\\udc80")
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: ")


def test_lerobot_convert_dcp_error_line_escapes_paths(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ckpt_tools.cli.lerobot_convert_dcp import convert_dcp_main

    with pytest.raises(SystemExit) as exit_info:
        convert_dcp_main([f"--checkpoint_dir={runs / 'single' / 'checkpoints' / 'last'}", "--dry_run=true"])
    captured = capsys.readouterr()
    assert exit_info.value.code == 3
    assert not RAW.search(captured.err + captured.out), captured.err
    assert "run\\x1b[2K\\r\\nhealthy\\u202e\\udc80" in captured.err


@pytest.mark.parametrize(
    ("env", "encoding"),
    [({"PYTHONIOENCODING": "utf-8"}, "utf-8"), ({"LC_ALL": "C", "PYTHONIOENCODING": "ascii"}, "ascii")],
    ids=["utf-8", "ascii"],
)
def test_a_real_process_writes_every_stream(
    files: Path, runs: Path, env: dict[str, str], encoding: str, tmp_path: Path
) -> None:
    """The installed entry point, a strict UTF-8 stdout (a surrogate cannot be written) and an ASCII one."""
    base = {k: v for k, v in os.environ.items() if k not in ("LC_ALL", "LANG", "PYTHONIOENCODING")}
    cases = [
        (["inspect", str(files / "hostile.safetensors"), "--tensors"], 0),
        (["inspect", str(files / "surrogate.safetensors"), "--tensors"], 0),
        (["verify-resume", str(runs / "single" / "checkpoints")], 1),
        (["convert-dcp", str(runs / "single" / "checkpoints" / "last")], 3),
    ]
    texts = []
    for args, code in cases:
        proc = subprocess.run(
            [sys.executable, "-m", "ckpt_tools.cli", *args],
            env={**base, **env},
            capture_output=True,
            timeout=120,
            cwd=tmp_path,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == code, out
        text = out.decode(encoding)  # strict: every byte is the stream's own encoding
        assert "Traceback" not in text, text
        assert not RAW.search(text), text
        texts.append(text)
    assert ("na\\xefve" if encoding == "ascii" else LETTERS) in texts[0]  # a letter the stream lacks: escaped


def test_cli_modules_write_only_through_echo() -> None:
    """No CLI module writes a line itself: each goes through :func:`ckpt_tools.cli.untrusted.echo`."""
    exempt = {"untrusted.py"}
    writers = []
    for path in sorted((REPO / "ckpt_tools" / "cli").glob("*.py")):
        if path.name in exempt:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("echo", "secho", "write") and _module_of(node):
                writers.append(f"{path.name}:{node.lineno} {_module_of(node)}.{node.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                writers.append(f"{path.name}:{node.lineno} print")
    assert writers == []


def _module_of(node: ast.Attribute) -> str | None:
    """``typer``, ``click``, ``sys.stdout`` or ``sys.stderr`` when ``node`` is one of their attributes."""
    value = node.value
    if isinstance(value, ast.Name) and value.id in ("typer", "click"):
        return value.id
    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "sys":
        return f"sys.{value.attr}" if value.attr in ("stdout", "stderr") else None
    return None
