"""``inspect --check-values`` / ``--verify-data`` read every byte: a bar on a terminal's stderr, never with --json.

The step is LeRobot 0.6.1's (fixtures/lerobot), given a record of its files by the trainer's own
record writer, so ``--verify-data`` has digests to read every byte against. No torchrun.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.rules import save_files
from ckpt_tools.inspect import inspect_path
from ckpt_tools.io.progress import ByteProgress, reporting_to
from devtools.procs import no_torch_env

LEROBOT_STEP = Path(__file__).resolve().parents[2] / "fixtures/lerobot/v0_6_1/single/checkpoints/000004"
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


class Tally(ByteProgress):
    """What the readers told the bar: the bytes they expected to read, and the bytes they read."""

    def __init__(self) -> None:
        self.expected = 0
        self.read = 0

    def expect(self, nbytes: int) -> None:
        self.expected += nbytes

    def advance(self, nbytes: int) -> None:
        self.read += nbytes


@pytest.fixture(scope="module")
def step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the LeRobot step with a ``save_files.json`` (full digests) written for it."""
    root = shutil.copytree(LEROBOT_STEP, tmp_path_factory.mktemp("progress") / "checkpoints" / "000004")
    save_files.write_record(StepPaths(root))
    return root


def float_bytes(path: Path) -> int:
    """The bytes of a safetensors file's floating-point tensors, from its header."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    return sum(e["data_offsets"][1] - e["data_offsets"][0] for k, e in header.items() if e.get("dtype") in FLOAT_DTYPES)


def run_on_terminal(*args: str) -> tuple[int, str, str]:
    """``ckpt-tools ARGS`` with stderr on a pseudo-terminal (stdout a pipe): exit code, stdout, what the terminal got."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # tqdm sizes its bar to it
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckpt_tools.cli", *args],
        stdout=subprocess.PIPE,
        stderr=follower,
        env=no_torch_env(),
        text=True,
    )
    os.close(follower)
    terminal = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        terminal += chunk
    os.close(leader)
    stdout, _ = proc.communicate(timeout=60)
    return proc.returncode, stdout, terminal.decode(errors="replace")


def test_check_values_reports_every_float_byte_it_reads(step: Path) -> None:
    tally = Tally()
    with reporting_to(tally):
        report = inspect_path(step, check_values=True)
    assert report.healthy and report.nonfinite == []
    files = sorted(step.rglob("*.safetensors"))
    assert len([c for c in report.checks if c.name.endswith(" values")]) == len(files)
    assert tally.expected == tally.read == sum(map(float_bytes, files)) > 0


def test_verify_data_reports_every_recorded_byte_it_reads(step: Path) -> None:
    tally = Tally()
    with reporting_to(tally):
        report = inspect_path(step, verify_data=True)
    assert report.healthy and report.data_verified
    assert tally.expected == tally.read == report.data_bytes > 0


@pytest.mark.parametrize("flag", ["--check-values", "--verify-data"])
def test_a_bar_on_a_terminal_none_with_json_or_a_pipe(step: Path, flag: str) -> None:
    code, stdout, terminal = run_on_terminal("inspect", str(step), flag)
    assert code == 0 and stdout.rstrip().endswith("healthy"), (stdout, terminal)
    assert "inspect: " in terminal and "B/s" in terminal, terminal  # tqdm's label and byte rate
    code, stdout, terminal = run_on_terminal("inspect", str(step), flag, "--json")
    assert code == 0 and json.loads(stdout)["healthy"] is True
    assert terminal == "", terminal
    piped = subprocess.run(
        [sys.executable, "-m", "ckpt_tools.cli", "inspect", str(step), flag],
        env=no_torch_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert piped.returncode == 0 and piped.stderr == ""
