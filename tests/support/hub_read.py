"""Checkpoints put on the loopback Hub by the real client, and the tools run against them.

:func:`upload` sends a local folder with ``HfApi.upload_folder`` in a separate process (the
client reads its endpoint and token from the environment at import time, see
:mod:`tests.support.hub_fixtures`); :func:`module_hub` is the ``hub`` fixture's server for a
whole test module (several tests read one uploaded checkpoint).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.fakes.hub.server import HubServer
from tests.support.hub_fixtures import HUB_ORG, HUB_USER, HubEndpoint, hub_process_env, new_token

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


@contextmanager
def module_hub(hf_home: Path) -> Iterator[HubEndpoint]:
    """A loopback Hub (user ``alice``) and an environment pointing at it, as the ``hub`` fixture makes one."""
    token = new_token()
    server = HubServer({token: HUB_USER}, orgs={HUB_USER: {HUB_ORG}})
    with server:
        yield HubEndpoint(server.url, server, hub_process_env(server.url, token, hf_home))
