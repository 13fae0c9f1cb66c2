"""What the ``hub`` fixture (tests/conftest.py) hands a test: a loopback Hub in front of real processes.

``huggingface_hub`` reads its settings from the environment *at import time* (its ``constants``
module), so the client is pointed at the server (:mod:`tests.fakes.hub.server`) through the
environment of a separate process - the ``ckpt-tools`` CLI, a ``python -c`` snippet, or a
``torchrun`` training job:

    def test_something(hub, tmp_path):
        url, server, env = hub
        subprocess.run([...], env=env)           # env is a complete environment
        assert server.files("alice/model")["model.safetensors"] == expected

``env`` is ``os.environ`` minus any inherited ``HF_*`` settings that would redirect or block
the client, plus :func:`hub_env_vars`: ``HF_ENDPOINT``, ``HF_TOKEN``, a fresh ``HF_HOME``,
``HF_HUB_DISABLE_XET=1``, ``HF_HUB_DISABLE_TELEMETRY=1``, ``NO_PROXY``/``no_proxy``.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from tests.fakes.hub.server import HubServer

HUB_USER = "alice"
HUB_ORG = "robot-lab"

# Inherited settings that would send the client elsewhere, block it, or hand it another token.
_CLEARED_ENV = (
    "HF_ENDPOINT",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_TOKEN_PATH",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_DISABLE_IMPLICIT_TOKEN",
    "HF_HUB_ENABLE_HF_TRANSFER",
    "CKPT_TOOLS_HUB_TIMEOUT",
)


class HubEndpoint(NamedTuple):
    """What the ``hub`` fixture yields: unpack as ``url, server, env``."""

    url: str
    server: HubServer
    env: dict[str, str]

    @property
    def token(self) -> str:
        return self.env["HF_TOKEN"]

    @property
    def hf_home(self) -> Path:
        return Path(self.env["HF_HOME"])

    @property
    def user(self) -> str:
        return HUB_USER


def new_token() -> str:
    """A token unlikely to appear anywhere by accident, so grepping for it proves a leak."""
    return "hf_" + secrets.token_hex(16)


def hub_env_vars(url: str, token: str | None, hf_home: Path) -> dict[str, str]:
    """The variables that point ``huggingface_hub`` (imported afterwards) at the loopback server."""
    out = {
        "HF_ENDPOINT": url,
        "HF_HOME": str(hf_home),
        "HF_HUB_DISABLE_XET": "1",  # Xet uploads speak a storage protocol this server does not serve
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    if token is not None:
        out["HF_TOKEN"] = token
    return out


def hub_process_env(url: str, token: str | None, hf_home: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """A complete environment for a child process that talks to the loopback Hub."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _CLEARED_ENV}
    env.update(hub_env_vars(url, token, hf_home))
    return env


def hf_download(env: dict[str, str], repo_id: str, filename: str, *, revision: str | None = None) -> Path:
    """Download one file with the real ``hf_hub_download`` in a child process; return its local path."""
    code = (
        "import sys\nfrom huggingface_hub import hf_hub_download\n"
        "print(hf_hub_download(sys.argv[1], sys.argv[2], revision=sys.argv[3] or None))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, repo_id, filename, revision or ""],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise AssertionError(f"hf_hub_download({repo_id}, {filename}) failed:\n{proc.stderr}")
    return Path(proc.stdout.strip().splitlines()[-1])


def assert_token_absent(token: str, roots: list[Path], texts: list[str], exclude: tuple[Path, ...] = ()) -> None:
    """The token appears in no captured output and no file under ``roots`` (bar ``exclude``, e.g. the token file)."""
    for text in texts:
        assert token not in text, "the token leaked into captured output"
    excluded = {p.resolve() for p in exclude}
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                path = Path(dirpath) / name
                if path.resolve() in excluded or path.is_symlink():
                    continue
                assert token.encode() not in path.read_bytes(), f"the token leaked into {path}"
