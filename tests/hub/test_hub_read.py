"""The tools read checkpoints on the Hub (``hf://OWNER/REPO[@REV][/PATH]``) by ranged reads, as they read local ones.

Against the loopback Hub with the real huggingface_hub client: a 1 GiB sharded DCP checkpoint
that ``inspect`` reads less than 1 % of (counted at the server), a real training run uploaded
with ``upload_folder`` that ``inspect``, ``verify-resume`` and ``reshard-plan`` judge exactly as
they judge the local copy, and the one-line errors of a path that names nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt_tools.errors import UsageError
from ckpt_tools.hub.location import HubLocation, parse_hub_path
from devtools.procs import no_torch_env, run_cli
from tests.support.hub_fixtures import HubEndpoint
from tests.support.hub_read import module_hub, upload

BIG_REPO = "alice/big-dcp"
RUN_REPO = "alice/act-run"
TENSOR_BYTES = 256 * 2**20  # four of them: a 1 GiB checkpoint


@pytest.fixture(scope="module")
def hub_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubEndpoint]:
    with module_hub(tmp_path_factory.mktemp("hf_home")) as hub:
        yield hub


def _cli(hub: HubEndpoint, *args: str) -> tuple[int, str, str]:
    proc = run_cli(*args, env=hub.env, no_torch=True)  # torch-free, as every tool
    return proc.returncode, proc.stdout, proc.stderr.strip()


def _checks(report: dict) -> list[tuple[str, str]]:
    return [(c["name"], c["status"]) for c in report["checks"]]


# ---------------------------------------------------------------- the spelling


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hf://alice/act", HubLocation("alice/act", None, "")),
        ("hf://alice/act/", HubLocation("alice/act", None, "")),
        ("hf://alice/act@v1.0/checkpoints/last", HubLocation("alice/act", "v1.0", "checkpoints/last")),
        ("hf://alice/act@refs%2Fpr%2F3/pretrained_model", HubLocation("alice/act", "refs/pr/3", "pretrained_model")),
    ],
)
def test_a_hub_path_parses_into_repo_revision_and_path(text: str, expected: HubLocation) -> None:
    assert parse_hub_path(text) == expected
    assert parse_hub_path(expected.url) == expected  # the spelling messages show reads back the same


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("hf://datasets/alice/frames", "a dataset repository holds no checkpoint"),
        ("hf://spaces/alice/demo", "a space repository holds no checkpoint"),
        ("hf://alice", "expected hf://OWNER/REPO[@REVISION][/PATH]"),
        ("hf://alice/-act", "is not a Hub repo id"),
        ("hf://alice/act@", "is not a revision"),
        ("hf://alice/act/../other", "'.' and '..' are not allowed"),
    ],
)
def test_a_bad_hub_path_is_one_usage_line(text: str, line: str) -> None:
    with pytest.raises(UsageError, match=line.replace("[", r"\[").replace(".", r"\.")):
        parse_hub_path(text)


# ---------------------------------------------------------------- a 1 GiB sharded checkpoint


@pytest.fixture(scope="module")
def big_dcp(hub_module: HubEndpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real torch DCP of four 256 MiB tensors, on disk and committed to the loopback Hub."""
    import torch
    import torch.distributed.checkpoint as dcp

    directory = tmp_path_factory.mktemp("big") / "pytorch_model_fsdp_0"
    state = {"model": {f"layers.{i}.weight": torch.full((TENSOR_BYTES // 4,), float(i)) for i in range(4)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "torch.distributed is disabled ... a single process"
        dcp.save(state, storage_writer=dcp.FileSystemWriter(directory, sync_files=False), no_dist=True)
    files = {f"pytorch_model_fsdp_0/{p.name}": p.read_bytes() for p in directory.iterdir()}
    hub_module.server.seed_repo(BIG_REPO, files)
    return directory


def test_inspect_of_a_1gib_dcp_on_the_hub_downloads_under_1_percent(hub_module: HubEndpoint, big_dcp: Path) -> None:
    server = hub_module.server
    total = sum(p.stat().st_size for p in big_dcp.iterdir())
    assert total > 2**30
    before, seen = server.bytes_sent(), len(server.requests)

    rc, out, err = _cli(hub_module, "inspect", f"hf://{BIG_REPO}/pytorch_model_fsdp_0", "--json")
    assert rc == 0, err
    downloaded = server.bytes_sent() - before
    assert downloaded < total / 100, f"{downloaded} bytes of {total}"  # measured: 2.7 KB in 3 requests
    assert not [r.path for r in server.requests[seen:] if r.path.endswith(".distcp")]  # no shard read at all

    remote = json.loads(out)
    local = json.loads(_cli(hub_module, "inspect", str(big_dcp), "--json")[1])
    assert remote["healthy"] and _checks(remote) == _checks(local)
    assert remote["weights"] == local["weights"]  # tensors, bytes by dtype, every rank's files and sizes
    assert remote["path"] == f"hf://{BIG_REPO}/pytorch_model_fsdp_0"


def test_a_hub_path_that_names_nothing_is_one_line(hub_module: HubEndpoint, big_dcp: Path) -> None:
    cases = {
        "hf://alice/no-such-repo": (3, "repository alice/no-such-repo not found, or not readable with this token"),
        f"hf://{BIG_REPO}@no-such-branch": (3, f"revision 'no-such-branch' not found in {BIG_REPO}"),
        f"hf://{BIG_REPO}/no/such/path": (3, f"no such file or directory in {BIG_REPO}"),
        "hf://datasets/alice/frames": (
            2,
            "a dataset repository holds no checkpoint; name a model repository (hf://OWNER/REPO[/PATH])",
        ),
    }
    for path, (code, line) in cases.items():
        rc, _, err = _cli(hub_module, "inspect", path)
        assert (rc, err) == (code, f"error: {path}: {line}"), (path, rc, err)
    # Reading every byte is not what ranged reads are for: refused, not "verified" over nothing.
    rc, _, err = _cli(hub_module, "inspect", f"hf://{BIG_REPO}/pytorch_model_fsdp_0", "--verify-data")
    assert rc == 2 and "--verify-data reads every byte of the checkpoint" in err and "download it first" in err


def test_a_hub_that_cannot_be_reached_is_one_line_and_exit_5(hub: HubEndpoint) -> None:
    hub.server.seed_repo("alice/act", {"pretrained_model/config.json": b"{}"})
    hub.server.stop()  # the port now refuses connections
    rc, _, err = _cli(hub, "inspect", "hf://alice/act")
    assert rc == 5
    assert err.startswith("error: hf://alice/act: network error talking to the Hub (listing the repository: ")
    assert len(err.splitlines()) == 1


# ---------------------------------------------------------------- a real run


@pytest.fixture(scope="module")
def run_on_hub(hub_module: HubEndpoint, runs: dict[str, Path]) -> Path:
    """The fixture's FSDP run (DCP shards + gathered weights, two saves), uploaded with ``upload_folder``."""
    upload(hub_module.env, runs["fsdp"], RUN_REPO)
    return runs["fsdp"]


# What only a local run has: its `last` link (an upload leaves symlinks out; the newest step
# stands for it) and, for verify-resume, the build (it reads files locally) and the default
# output dir (a run on the Hub is never written to).
LOCAL_ONLY = {"last link", "policy-builds", "output"}


@pytest.mark.torchrun
@pytest.mark.parametrize(
    "command",
    [
        ("inspect",),
        ("verify-resume", "--skip-build"),
        ("reshard-plan", "--nproc", "1"),
    ],
    ids=["inspect", "verify-resume", "reshard-plan-1"],
)
def test_a_run_on_the_hub_is_judged_as_its_local_copy(
    hub_module: HubEndpoint, run_on_hub: Path, command: tuple[str, ...]
) -> None:
    name, *flags = command
    rc, out, err = _cli(hub_module, name, f"hf://{RUN_REPO}", *flags, "--json")
    local_rc, local_out, _ = _cli(hub_module, name, str(run_on_hub), *flags, "--json")
    assert rc == local_rc, err
    remote, local = json.loads(out), json.loads(local_out)
    key = "blockers" if name == "reshard-plan" else "checks"
    if name == "reshard-plan":
        assert remote["workable"] == local["workable"] and remote["rank_groups"] == local["rank_groups"]
        assert remote["weights"] == local["weights"] and remote["optimizer"] == local["optimizer"]
    else:
        strip = [c for c in remote[key] if c["name"].split(": ")[-1] not in LOCAL_ONLY]
        local_strip = [c for c in local[key] if c["name"].split(": ")[-1] not in LOCAL_ONLY]
        assert [(c["name"], c["status"]) for c in strip] == [(c["name"], c["status"]) for c in local_strip]
    assert remote["checkpoint"] == f"hf://{RUN_REPO}/checkpoints/000008"


@pytest.mark.torchrun
def test_convert_dcp_from_the_hub_writes_the_bytes_of_a_local_conversion(
    hub_module: HubEndpoint, run_on_hub: Path, tmp_path: Path
) -> None:
    step = f"hf://{RUN_REPO}/checkpoints/000008"
    for what in ("model", "optimizer"):
        remote, local = tmp_path / f"hub-{what}", tmp_path / f"local-{what}"
        rc, _, err = _cli(hub_module, "convert-dcp", step, "--what", what, "--output", str(remote), "-q")
        assert rc == 0, err
        assert _cli(hub_module, "convert-dcp", str(run_on_hub / "checkpoints/000008"), "--what", what, "--output",
                    str(local), "-q")[0] == 0  # fmt: skip
        assert sorted(p.name for p in remote.iterdir()) == sorted(p.name for p in local.iterdir())
        for f in local.iterdir():
            assert (remote / f.name).read_bytes() == f.read_bytes(), f.name
    # LeRobot's spelling reads the Hub the same way.
    lerobot = tmp_path / "lerobot"
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_tools.cli.lerobot_convert_dcp", f"--checkpoint_dir={step}", f"--output={lerobot}"],
        env=no_torch_env(hub_module.env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (lerobot / "model.safetensors").read_bytes() == (tmp_path / "local-model/model.safetensors").read_bytes()
    # A checkpoint on the Hub is only read: the output must be named, and nothing is deleted or pushed from it.
    refusals = {
        (): f"error: {step}: name a local --output (a checkpoint on the Hub is never written to)",
        ("--output", str(tmp_path / "x"), "--delete-dcp"): (
            f"error: {step}: --delete-dcp deletes local shards; a checkpoint on the Hub is never changed"
        ),
    }
    for flags, line in refusals.items():
        assert _cli(hub_module, "convert-dcp", step, *flags)[::2] == (2, line)
    assert not (tmp_path / "x").exists()


@pytest.mark.torchrun
def test_resume_from_the_hub_is_bit_exact(hub_module: HubEndpoint, run_on_hub: Path, tmp_path: Path) -> None:
    from devtools.training import assert_tensors_equal, gathered_weights, ok, train

    out = tmp_path / "resumed"
    step = f"hf://{RUN_REPO}/checkpoints/000004"
    refused = train("--resume=true", f"--config_path={step}", nproc=1, env=hub_module.env)
    assert refused.returncode == 2
    assert f"--config_path={step}: name the local --output_dir the resumed run writes into" in refused.stderr

    before = hub_module.server.bytes_sent()
    proc = ok(train("--resume=true", f"--config_path={step}", f"--output_dir={out}", nproc=2, env=hub_module.env))
    assert "resumed from" in proc.stdout and "at step 4" in proc.stdout
    # Only step 4's files came down (not step 8's, not the run's logs), and each once, for both ranks.
    step_bytes = sum(p.stat().st_size for p in (run_on_hub / "checkpoints/000004").rglob("*") if p.is_file())
    downloaded = hub_module.server.bytes_sent() - before
    assert step_bytes <= downloaded < step_bytes * 1.1, (downloaded, step_bytes)
    # The run goes on exactly as the uninterrupted one did: the same weights, bit for bit, and the same losses.
    assert_tensors_equal(gathered_weights(out, 8), gathered_weights(run_on_hub, 8))
    losses = [line for line in proc.stdout.splitlines() if line.startswith("step ") and "loss" in line]
    assert [_loss(x) for x in losses] == [
        _loss(x) for x in _run_stdout(run_on_hub) if x.startswith(("step 5", "step 6", "step 7", "step 8"))
    ]


def _loss(line: str) -> str:
    return line.split(",")[0]  # "step 5: loss 0.8165"


def _run_stdout(run: Path) -> list[str]:
    return (run.parent / f"{run.name}.stdout").read_text().splitlines()


@pytest.mark.torchrun
def test_verify_resume_on_the_hub_says_the_build_was_not_run(hub_module: HubEndpoint, run_on_hub: Path) -> None:
    rc, out, err = _cli(hub_module, "verify-resume", f"hf://{RUN_REPO}", "--json")
    assert rc == 0, err
    build = {c["name"]: c for c in json.loads(out)["checks"]}["policy-builds"]
    assert build["message"].startswith("not run: the checkpoint is on the Hub")
