"""Checkpoints put on the loopback Hub by the real client, and the tools run against them.

:func:`upload` sends a local folder with ``HfApi.upload_folder`` in a separate process (the
client reads its endpoint and token from the environment at import time, see
:mod:`tests.support.hub_fixtures`); :func:`tools` runs ``ckpt-tools`` with that environment.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from devtools.procs import script

UPLOAD = """
import sys
from huggingface_hub import HfApi
repo, folder, path_in_repo = sys.argv[1:4]
api = HfApi()
api.create_repo(repo, exist_ok=True)
api.upload_folder(repo_id=repo, folder_path=folder, path_in_repo=path_in_repo or None)
"""


def upload(env: dict[str, str], folder: Path, repo_id: str, path_in_repo: str = "") -> None:
    """``folder`` committed to ``repo_id`` (under ``path_in_repo``) by huggingface_hub's ``upload_folder``."""
    proc = subprocess.run(
        [sys.executable, "-c", UPLOAD, repo_id, str(folder), path_in_repo],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def tools(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``ckpt-tools ARGS`` in a process pointed at the loopback Hub."""
    return subprocess.run([script("ckpt-tools"), *args], env=env, capture_output=True, text=True, timeout=timeout)
