"""Network faults during a push: one clear line, exit code 5, local files untouched, and a retry that works."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.procs import run_cli
from tests.support.hub_data import PUBLISHED, assert_published_as_local, make_step_dir, tree_digest
from tests.support.hub_fixtures import HubEndpoint, assert_token_absent

REPO = "alice/act-pick-place"
TIMEOUT_S = "2"  # CKPT_TOOLS_HUB_TIMEOUT for these pushes: a held request fails fast


def _arm(hub: HubEndpoint, fault: str) -> None:
    server = hub.server
    if fault == "refused":
        server.stop()
    elif fault == "timeout":
        server.faults.hang("commit")
    elif fault == "http500":
        server.faults.fail("commit", 500)
    elif fault == "dropped":
        server.faults.drop("commit")
    else:  # pragma: no cover - a typo in the parametrization
        raise ValueError(fault)


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("refused", "(create the repo): cannot connect to http://127.0.0.1:"),
        ("timeout", "(commit): no answer from http://127.0.0.1:"),
        ("http500", "(commit): HTTP 500 (injected failure (commit))"),
        ("dropped", "(commit): network error talking to http://127.0.0.1:"),
    ],
)
def test_fault_gives_one_line_and_exit_5_then_a_retry_succeeds(
    hub: HubEndpoint, tmp_path: Path, fault: str, expected: str
) -> None:
    server = hub.server
    env = {**hub.env, "CKPT_TOOLS_HUB_TIMEOUT": TIMEOUT_S}
    step = make_step_dir(tmp_path)
    before = tree_digest(tmp_path)
    _arm(hub, fault)

    failed = run_cli("push", str(step.root), "--repo-id", REPO, env=env, no_torch=True)
    assert failed.returncode == 5, failed.stderr
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert errors[0].startswith(f"error: Hub push to {REPO} failed {expected}"), errors[0]
    # What the Hub holds, what happened locally, and the command that retries - which the test then runs.
    outcome = (
        "the Hub may or may not have made the commit" if fault in ("timeout", "dropped") else "nothing was published"
    )
    assert f"; {outcome}" in errors[0], errors[0]
    assert errors[0].endswith(f"; no local file was changed; retry with: ckpt-tools push {step.root} --repo-id {REPO}")
    if fault == "timeout":
        assert f"within {TIMEOUT_S} s (set CKPT_TOOLS_HUB_TIMEOUT to wait longer)" in errors[0]
    assert tree_digest(tmp_path) == before
    # Nothing was committed: the repo (if it got created) still holds only its initial commit.
    assert not server.has_repo(REPO) or set(server.files(REPO)) == {".gitattributes"}

    server.faults.clear()
    server.start()  # no-op unless the fault stopped it; same port, repositories intact
    retried = run_cli("push", str(step.root), "--repo-id", REPO, env=env, no_torch=True)
    assert retried.returncode == 0, retried.stderr
    files = server.files(REPO)
    assert set(files) == {*PUBLISHED, "README.md", ".gitattributes"}
    assert_published_as_local(files, step)
    assert tree_digest(tmp_path) == before
    assert_token_absent(hub.token, [tmp_path, hub.hf_home], [failed.stdout, failed.stderr, retried.stderr])


def test_failed_commit_keeps_uploaded_objects_so_the_retry_sends_no_bytes_again(
    hub: HubEndpoint, tmp_path: Path
) -> None:
    server = hub.server
    step = make_step_dir(tmp_path)
    server.faults.fail("commit", 500)
    assert run_cli("push", str(step.root), "--repo-id", REPO, env=hub.env, no_torch=True).returncode == 5
    sent = len(server.requests_for("lfs_put"))
    assert sent == 2  # both safetensors files reached LFS storage before the commit failed
    assert run_cli("push", str(step.root), "--repo-id", REPO, env=hub.env, no_torch=True).returncode == 0
    assert len(server.requests_for("lfs_put")) == sent  # the LFS batch answered "already stored"
    assert len(server.repo(REPO).history()) == 2  # initial commit + one upload


def test_a_transient_500_mid_upload_is_retried_by_the_client(hub: HubEndpoint, tmp_path: Path) -> None:
    server = hub.server
    step = make_step_dir(tmp_path)
    server.faults.fail("lfs_put", 500, skip=1)  # the second LFS PUT fails once
    proc = run_cli("push", str(step.root), "--repo-id", REPO, env=hub.env, no_torch=True)
    assert proc.returncode == 0, proc.stderr
    statuses = sorted(r.status for r in server.requests_for("lfs_put"))
    assert statuses == [200, 200, 500]
    files = server.files(REPO)
    assert_published_as_local(files, step)


def test_the_bounded_client_applies_during_a_push_only_and_respects_a_callers_factory() -> None:
    import huggingface_hub
    from huggingface_hub.utils import _http

    from ckpt_tools.hub.client import Bounds
    from ckpt_tools.hub.push import _bounded_client

    before = _http._GLOBAL_CLIENT_FACTORY
    with _bounded_client(Bounds(7.0, 30.0, 1 << 20)):
        timeout = huggingface_hub.get_session().timeout
        assert (timeout.read, timeout.write, timeout.connect) == (7.0, 7.0, 7.0)
    assert _http._GLOBAL_CLIENT_FACTORY is before

    def own_factory():  # a caller who configured the client keeps their configuration
        return _http.default_client_factory()

    huggingface_hub.set_client_factory(own_factory)
    try:
        with _bounded_client(Bounds(7.0, 30.0, 1 << 20)):
            assert _http._GLOBAL_CLIENT_FACTORY is own_factory
    finally:
        huggingface_hub.set_client_factory(before)


def test_a_proxy_from_the_environment_is_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client mounts transports of its own for the environment's proxies; ours replace them."""
    import huggingface_hub

    from ckpt_tools.hub.client import Bounds
    from ckpt_tools.hub.push import _bounded_client

    monkeypatch.setenv("HTTPS_PROXY", "http://user:secret@127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "localhost")
    with _bounded_client(Bounds(7.0, 30.0, 1 << 20)):
        client = huggingface_hub.get_session()
        for url, pool in (("https://huggingface.co/api/x", "HTTPProxy"), ("http://localhost/x", "ConnectionPool")):
            used = client._transport_for_url(client.build_request("GET", url).url)
            assert type(used).__module__ == "ckpt_tools.hub.client", url
            assert type(used._pool).__name__ == pool, url
