"""The tool side of ckpt_tools imports and runs in a process where importing torch fails."""

from __future__ import annotations

import subprocess
import sys

from devtools.procs import no_torch_env, run_cli, script

IMPORT_ALL_TOOL_MODULES = """
import importlib, pkgutil, ckpt_tools
names = [m.name for m in pkgutil.walk_packages(ckpt_tools.__path__, "ckpt_tools.")
         if not m.name.startswith("ckpt_tools.train") and not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
import sys
assert "torch" not in sys.modules
print(len(names))
"""


def test_torch_is_really_blocked() -> None:
    proc = subprocess.run([sys.executable, "-c", "import torch"], env=no_torch_env(), capture_output=True, text=True)
    assert proc.returncode != 0
    assert "ModuleNotFoundError: No module named 'torch' (blocked" in proc.stderr


def test_every_tool_module_imports_without_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL_TOOL_MODULES], env=no_torch_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) >= 5


def test_cli_version_without_torch() -> None:
    proc = run_cli("--version", no_torch=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ckpt-tools ")


def test_the_trainer_without_the_training_extra_says_what_to_install() -> None:
    """A tools-only install (no torch): `ckpt-train` is one line naming the extra, not an ImportError traceback."""
    for args in (["--dataset.root=fixtures/tiny_robot", "--policy.type=act", "--output_dir=out"], ["--help"]):
        proc = subprocess.run([script("ckpt-train"), *args], env=no_torch_env(), capture_output=True, text=True)
        assert proc.returncode == 2 and not proc.stdout, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("error: ckpt-train needs the `training` extra: torch cannot be imported")
        assert "pip install -e '.[training]'" in lines[0]
