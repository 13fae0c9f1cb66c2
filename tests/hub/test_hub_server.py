"""The loopback Hub is strict where the real one is, so the push tests can fail for the right reasons."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.hub.server import HubServer
from tests.support.hub_fixtures import HubEndpoint

TOKEN = "hf_server_selftest"


@pytest.fixture
def server() -> Iterator[HubServer]:
    with HubServer({TOKEN: "alice"}) as s:
        yield s


def _call(
    server: HubServer, method: str, path: str, body: Any = None, *, token: str | None = TOKEN, raw: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(server.url + path, data=data, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_writes_need_a_valid_token_with_rights_on_the_namespace(server: HubServer) -> None:
    create = {"name": "m", "organization": None, "type": "model"}
    assert _call(server, "POST", "/api/repos/create", create, token=None)[0] == 401
    assert _call(server, "POST", "/api/repos/create", create, token="hf_wrong")[0] == 401
    assert _call(server, "POST", "/api/repos/create", {**create, "organization": "bob"})[0] == 403
    status, _, body = _call(server, "POST", "/api/repos/create", create)
    assert status == 200 and json.loads(body)["url"] == f"{server.url}/alice/m"
    status, _, body = _call(server, "POST", "/api/repos/create", create)
    assert status == 409 and json.loads(body)["url"] == f"{server.url}/alice/m"  # the client reads it
    assert all(r.user in ("alice", None) for r in server.requests)
    assert not any("authorization" in r.headers for r in server.requests)  # the token is never stored


def test_lfs_upload_must_match_its_announced_sha256_and_size(server: HubServer) -> None:
    server.seed_repo("alice/m", {})
    content = b"\x00weights" * 100
    oid = hashlib.sha256(content).hexdigest()
    batch = {"operation": "upload", "objects": [{"oid": oid, "size": len(content)}], "hash_algo": "sha256"}
    _, _, body = _call(server, "POST", "/alice/m.git/info/lfs/objects/batch", batch)
    href = json.loads(body)["objects"][0]["actions"]["upload"]["href"]
    path = href.removeprefix(server.url)
    assert _call(server, "PUT", path, raw=content[:-1], token=None)[0] == 400  # short
    assert _call(server, "PUT", path, raw=content[:-1] + b"X", token=None)[0] == 400  # same size, other bytes
    assert _call(server, "PUT", path, raw=content, token=None)[0] == 200
    _, _, again = _call(server, "POST", "/alice/m.git/info/lfs/objects/batch", batch)
    assert "actions" not in json.loads(again)["objects"][0]  # already stored: nothing to upload


def test_a_commit_may_only_reference_uploaded_lfs_objects(server: HubServer) -> None:
    server.seed_repo("alice/m", {})
    header = {"key": "header", "value": {"summary": "s", "description": ""}}
    missing = {"key": "lfsFile", "value": {"path": "model.safetensors", "algo": "sha256", "oid": "0" * 64, "size": 3}}
    payload = b"\n".join(json.dumps(x).encode() for x in (header, missing))
    assert _call(server, "POST", "/api/models/alice/m/commit/main", raw=payload)[0] == 422
    regular = {
        "key": "file",
        "value": {"path": "a.json", "content": base64.b64encode(b"{}").decode(), "encoding": "base64"},
    }
    payload = b"\n".join(json.dumps(x).encode() for x in (header, regular))
    status, _, body = _call(server, "POST", "/api/models/alice/m/commit/main", raw=payload)
    assert status == 200 and json.loads(body)["commitOid"] == server.repo("alice/m").branches["main"]
    assert server.files("alice/m")["a.json"] == b"{}"


def test_resolve_serves_committed_bytes_with_the_headers_the_client_needs(server: HubServer) -> None:
    oid = server.seed_repo("alice/m", {"model.safetensors": b"abc" * 10, "config.json": b"{}"})
    status, headers, body = _call(server, "GET", "/alice/m/resolve/main/model.safetensors", token=None)
    assert status == 200 and body == b"abc" * 10
    assert headers["X-Repo-Commit"] == oid and headers["ETag"] == f'"{hashlib.sha256(body).hexdigest()}"'
    status, headers, _ = _call(server, "GET", "/alice/m/resolve/main/missing.json", token=None)
    assert status == 404 and headers["X-Error-Code"] == "EntryNotFound"
    status, headers, _ = _call(server, "GET", "/alice/m/resolve/nope/config.json", token=None)
    assert status == 404 and headers["X-Error-Code"] == "RevisionNotFound"


def test_a_seeded_dataset_downloads_with_snapshot_download(hub: HubEndpoint) -> None:
    """What a training test needs to serve ``--dataset.repo_id`` from the loopback Hub."""
    files = {"meta/info.json": b'{"fps": 10}', "data/chunk-000/file-000.parquet": b"PAR1" + bytes(64)}
    hub.server.seed_repo("alice/pick-place", files, repo_type="dataset")
    code = (
        "import os, sys\nfrom huggingface_hub import snapshot_download\n"
        "root = snapshot_download('alice/pick-place', repo_type='dataset')\n"
        "for name in sorted(sys.argv[1:]):\n    print(open(os.path.join(root, name), 'rb').read().hex())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, *files], env=hub.env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [files[name].hex() for name in sorted(files)]
    assert not hub.server.requests_for("unknown")
