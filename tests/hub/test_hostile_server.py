"""A push against a hostile or broken server ends, bounded, with one true line: a deadline per request, a cap on what an answer may hold, local failures named as local.

Real processes against the loopback Hub of tests/fakes/hub/server.py, with the real
huggingface_hub client: a server that trickles one byte at a time (no per-read timeout
fires), one that answers with a body of hundreds of MiB, a local file that disappears in the
middle of the upload, names and messages that cannot be encoded, and a conversion whose push
then fails. Each must end within its bounds, with one line that says what happened - a local
problem as a local problem, with its own exit code - and how to retry.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from devtools.procs import no_torch_env, run_cli
from tests.support.dcp_fixtures import save_model_dcp
from tests.support.hub_data import PUBLISHED, make_step_dir, tree_digest, weights
from tests.support.hub_fixtures import HubEndpoint

REPO = "alice/act-pick-place"
DEADLINE_S = 2.0  # CKPT_TOOLS_HUB_DEADLINE in these tests
MiB = 1 << 20


def _error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _push(hub: HubEndpoint, folder: Path, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**hub.env, "CKPT_TOOLS_HUB_TIMEOUT": "30", "CKPT_TOOLS_HUB_DEADLINE": str(DEADLINE_S)}
    return run_cli("push", str(folder), "--repo-id", REPO, *extra, env=env, no_torch=True, timeout=timeout)


@pytest.mark.parametrize(
    ("route", "phase", "stage"),
    [
        ("create_repo", "headers", "create the repo"),
        ("create_repo", "body", "create the repo"),
        ("lfs_batch", "headers", "LFS upload negotiation"),  # a call the client retries on timeouts
        ("commit", "body", "commit"),
    ],
)
def test_a_trickling_server_ends_the_push_at_the_deadline(
    hub: HubEndpoint, tmp_path: Path, route: str, phase: str, stage: str
) -> None:
    """One byte every 0.3 s never trips the 30 s per-read timeout; the deadline ends the request."""
    step = make_step_dir(tmp_path)
    before = tree_digest(tmp_path)
    hub.server.faults.trickle(route, phase=phase, interval=0.3)
    started = time.monotonic()
    try:
        proc = _push(hub, step.root, timeout=40)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the push was still waiting on the trickling {route} after 40 s")
    took = time.monotonic() - started
    assert proc.returncode == 5, proc.stderr
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(f"error: Hub push to {REPO} failed ({stage}): no complete answer from"), errors[0]
    assert f"within {DEADLINE_S:g} s" in errors[0] and "CKPT_TOOLS_HUB_DEADLINE" in errors[0], errors[0]
    assert "retry with: ckpt-tools push" in errors[0], errors[0]
    assert took < 25, f"{took:.1f} s"  # process start-up + the uploads before + one deadline, never a hang
    assert hub.server.faults.fired(route) == 1  # abandoned once, not retried into five deadlines
    assert tree_digest(tmp_path) == before


# Runs the CLI and writes its own peak RSS (VmHWM of its address space) at exit. Not wait4's
# ru_maxrss: that counts the pages of the (large) pytest process the child was forked from.
_MEASURED = (
    "import atexit, os, re, runpy, sys\n"
    "def peak():\n"
    "    status = open('/proc/self/status').read()\n"
    "    open(os.environ['PEAK_RSS_FILE'], 'w').write(re.search(r'VmHWM:\\s+(\\d+)', status).group(1))\n"
    "atexit.register(peak)\n"
    "sys.argv = ['ckpt-tools', *sys.argv[1:]]\n"
    "runpy.run_module('ckpt_tools.cli', run_name='__main__')\n"
)


def _run_measured(args: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, int]:
    """Run ``ckpt-tools ARGS``; return its exit code, stderr and its own peak RSS in bytes."""
    with tempfile.TemporaryDirectory() as scratch:
        peak_file = Path(scratch) / "peak"
        proc = subprocess.run(
            [sys.executable, "-c", _MEASURED, *args],
            env={**no_torch_env(env), "PEAK_RSS_FILE": str(peak_file)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )
        return proc.returncode, proc.stderr.decode(errors="replace"), int(peak_file.read_text()) * 1024


@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "until-close"])
def test_a_huge_answer_is_refused_with_bounded_memory(hub: HubEndpoint, tmp_path: Path, announce: bool) -> None:
    """512 MiB of body for a JSON reply: read at most the cap, then one line - not 512 MiB of RSS."""
    size = 512 * MiB
    step = make_step_dir(tmp_path)
    hub.server.faults.flood("create_repo", size, announce=announce)
    env = {**hub.env, "CKPT_TOOLS_HUB_TIMEOUT": "30", "CKPT_TOOLS_HUB_DEADLINE": "60"}
    code, stderr, peak = _run_measured(["push", str(step.root), "--repo-id", REPO], env, timeout=60)
    assert code == 5, stderr
    errors = _error_lines(stderr)
    assert len(errors) == 1, stderr
    assert errors[0].startswith(f"error: Hub push to {REPO} failed (create the repo): the answer from"), errors[0]
    assert "larger than" in errors[0] and "refused" in errors[0], errors[0]
    assert peak < 200 * MiB, f"peak RSS {peak / MiB:.0f} MiB for a {size // MiB} MiB answer"


def test_a_file_that_vanishes_mid_upload_is_a_local_error_not_the_hubs(hub: HubEndpoint, tmp_path: Path) -> None:
    """The file is checked and hashed, then removed before its bytes are sent: exit 3, said to be local."""
    step = make_step_dir(tmp_path)
    weights_file = step.pretrained_model / "model.safetensors"
    hub.server.faults.hang("lfs_batch", then="answer")
    env = {**hub.env, "CKPT_TOOLS_HUB_TIMEOUT": "30", "CKPT_TOOLS_HUB_DEADLINE": "30"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckpt_tools.cli", "push", str(step.root), "--repo-id", REPO],
        env=no_torch_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        waited = time.monotonic()
        while hub.server.faults.fired("lfs_batch") == 0:
            assert proc.poll() is None and time.monotonic() - waited < 30, "the push never reached the LFS batch"
            time.sleep(0.05)
        weights_file.unlink()
        hub.server.faults.release()
        _out, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, stderr
    errors = _error_lines(stderr)
    assert len(errors) == 1, stderr
    line = errors[0]
    assert str(weights_file) in line and "No such file or directory" in line, line
    assert "local problem, not the Hub's" in line and "nothing was published" in line, line
    assert "retry is safe" not in line and "Hub push to" not in line, line
    assert set(hub.server.files(REPO)) == {".gitattributes"}


def test_a_file_name_that_is_not_utf8_is_refused_before_any_request(hub: HubEndpoint, tmp_path: Path) -> None:
    step = make_step_dir(tmp_path)
    odd = os.fsencode(step.pretrained_model) + b"/caf\xe9.json"
    with open(odd, "wb") as f:
        f.write(b'{"a": 1}\n')
    proc = _push(hub, step.root)
    assert proc.returncode == 3, proc.stderr
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and "caf\\xe9.json: the file name is not valid UTF-8" in errors[0], proc.stderr
    assert "Hub push" not in errors[0] and "retry is safe" not in errors[0], errors[0]
    assert hub.server.requests == []  # refused locally: nothing reached the network


def test_a_commit_message_that_is_not_utf8_is_refused_before_any_request(hub: HubEndpoint, tmp_path: Path) -> None:
    step = make_step_dir(tmp_path)
    env = {**hub.env, "CKPT_TOOLS_HUB_DEADLINE": str(DEADLINE_S)}
    args = [sys.executable, "-m", "ckpt_tools.cli", "push", str(step.root), "--repo-id", REPO]
    proc = subprocess.run(
        [*map(os.fsencode, args), b"--commit-message", b"step \xff"],
        env=no_torch_env(env),
        capture_output=True,
        timeout=60,
    )
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 2, stderr
    errors = _error_lines(stderr)
    assert len(errors) == 1 and errors[0].startswith("error: --commit-message: not valid UTF-8"), stderr
    assert hub.server.requests == []


def _dcp_only_step(tmp_path: Path) -> Path:
    """A step whose pretrained_model/ holds its weights only as real DCP shards (a ``dcp``-format save)."""
    step = make_step_dir(tmp_path)
    pm = step.pretrained_model
    (pm / "model.safetensors").unlink()
    for shard in (pm / "pytorch_model_fsdp_0").iterdir():
        shard.unlink()
    save_model_dcp(pm / "pytorch_model_fsdp_0", weights(0))
    return step.root


def test_a_failed_push_after_a_conversion_says_what_was_written_and_how_to_retry_the_push(
    hub: HubEndpoint, tmp_path: Path
) -> None:
    step = _dcp_only_step(tmp_path)
    pm = step / "pretrained_model"
    shards = tree_digest(pm / "pytorch_model_fsdp_0")
    hub.server.faults.fail("create_repo", 500, times=10)
    failed = run_cli(
        "convert-dcp", str(step), "--delete-dcp", "--push-to-hub", REPO, "--quiet", env=hub.env, no_torch=True
    )
    assert failed.returncode == 5, failed.stderr
    errors = _error_lines(failed.stderr)
    assert len(errors) == 1, failed.stderr
    line = errors[0]
    assert f"Hub push to {REPO} failed (create the repo): HTTP 500" in line, line
    assert "untouched" not in line, line  # the conversion did write: it must not say nothing changed
    assert f"wrote and verified {pm / 'model.safetensors'}" in line, line
    assert "the DCP shards were kept" in line, line
    assert tree_digest(pm / "pytorch_model_fsdp_0") == shards
    assert (pm / "model.safetensors").is_file()

    # The command it gives retries the push alone - and works.
    retry = line.split("retry the push alone with: ", 1)[1].split(" (", 1)[0].rstrip(";")
    argv = shlex.split(retry)
    assert argv[:2] == ["ckpt-tools", "push"], retry
    hub.server.faults.clear()
    retried = run_cli(*argv[1:], env=hub.env, no_torch=True)
    assert retried.returncode == 0, retried.stderr
    files = hub.server.files(REPO)
    assert files["model.safetensors"] == (pm / "model.safetensors").read_bytes()
    assert set(PUBLISHED) <= set(files)
