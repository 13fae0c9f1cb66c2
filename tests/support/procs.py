"""Run real processes for tests: the CLIs, torch-free interpreters, torchrun jobs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NO_TORCH_DIR = Path(__file__).resolve().parent / "no_torch"


def no_torch_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which ``import torch`` raises ImportError."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join([str(NO_TORCH_DIR), str(REPO), out.get("PYTHONPATH", "")])
    return out


def run_cli(
    *args: str,
    no_torch: bool = False,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``ckpt-tools ARGS`` as a separate process (the installed entry point's module)."""
    base = no_torch_env(env) if no_torch else dict(os.environ if env is None else env)
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tools.cli", *args],
        env=base,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def script(name: str) -> str:
    """Absolute path of an installed console script (e.g. ckpt-train)."""
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed: pip install -e '.[training,dev]'")
    return found
