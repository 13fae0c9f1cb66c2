"""What ``ckpt-tools push`` publishes from trainer-written runs: the weights alone, a whole step, a whole run.

The checkpoints are the session's FSDP (safetensors + DCP shards) and HSDP (DCP only) runs of
the training core (tests/conftest.py ``runs``); the Hub is the loopback server driven by the
real ``huggingface_hub`` client. A whole step published this way is downloaded with
``snapshot_download`` and must then pass ``inspect`` and ``verify-resume`` and resume with
``ckpt-train`` exactly as the local run continued - and no published byte may hold a local
absolute path (the run's directory, this checkout's dataset path, the home directory).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_tools.dcp.metadata import parse_metadata
from ckpt_tools.format import layout
from ckpt_tools.format.rules import save_files
from ckpt_tools.hub.local_paths import neutralize_json
from devtools.procs import REPO, free_port, run_cli
from devtools.training import FIXTURE_DATASET, LAYOUTS, assert_tensors_equal, gathered_weights, ok, train
from tests.support.hub_fixtures import HubEndpoint
from tests.support.hub_read import upload

STEP = "000004"  # the fixture runs save at 4 and 8; `last` is 000008


def _push(hub: HubEndpoint, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("push", *args, env=hub.env, no_torch=True)


def _local_paths(runs: dict[str, Path]) -> list[bytes]:
    """What of this machine a published file could leak: the runs' dir, the checkout, home - whole, and
    the runs' own directory names (torch pickles a path as its parts) and a save's partial dir name."""
    base = runs["fsdp"].parent
    found = {str(base), str(base.resolve()), str(REPO), str(Path.home()), base.name, base.parent.name, ".partial"}
    return sorted(p.encode() for p in found)


def _assert_no_local_path(published: dict[str, bytes], runs: dict[str, Path]) -> None:
    for name, data in published.items():
        for path in _local_paths(runs):
            assert path not in data, f"{path.decode()} published in {name}"


def _snapshot(hub: HubEndpoint, repo_id: str, local_dir: Path) -> Path:
    """Download the whole repo with the real client into ``local_dir`` (regular files, as a user gets them)."""
    code = "import sys\nfrom huggingface_hub import snapshot_download\nsnapshot_download(sys.argv[1], local_dir=sys.argv[2])\n"
    proc = subprocess.run(
        [sys.executable, "-c", code, repo_id, str(local_dir)], env=hub.env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return local_dir


def _step_files(step: Path) -> set[str]:
    """The files of a trainer-written step a whole-step push must publish (DCP's hidden .metadata included)."""
    keep = {layout.DCP_METADATA, layout.DCP_INDEX}
    return {
        p.relative_to(step).as_posix()
        for p in step.rglob("*")
        if p.is_file() and (not p.name.startswith(".") or p.name in keep)
    }


def test_default_push_publishes_the_weights_alone(hub: HubEndpoint, runs: dict[str, Path]) -> None:
    repo = "alice/act-weights"
    step = runs["fsdp"] / layout.CHECKPOINTS_DIR / "last"
    proc = _push(hub, str(step), "--repo-id", repo, "--json")
    assert proc.returncode == 0, proc.stderr

    published = hub.server.files(repo)
    model = step.resolve() / layout.PRETRAINED_MODEL_DIR
    expected = {p.name for p in model.iterdir() if p.is_file()}
    assert set(published) == expected | {"README.md", ".gitattributes"}
    assert not any(name.startswith((layout.TRAINING_STATE_DIR, layout.MODEL_DCP_DIR)) for name in published)
    assert published["model.safetensors"] == (model / "model.safetensors").read_bytes()
    # train_config.json goes as a copy with its local paths set to null; the local file is untouched.
    config = json.loads(published[layout.TRAIN_CONFIG])
    local = json.loads((model / layout.TRAIN_CONFIG).read_text())
    assert config["dataset"]["root"] is None and config["output_dir"] is None
    assert local["dataset"]["root"] == str(FIXTURE_DATASET)
    assert {k: v for k, v in config.items() if k != "output_dir"} == {
        **{k: v for k, v in local.items() if k != "output_dir"},
        "dataset": {**local["dataset"], "root": None},
    }
    card = published["README.md"].decode()
    assert "## Local paths" in card and "`dataset.root`, `output_dir`" in card
    _assert_no_local_path(published, runs)


def test_local_paths_of_every_form_are_published_as_null(tmp_path: Path) -> None:
    config = {
        "dataset": {"repo_id": "alice/pick", "root": "/home/alice/data/pick"},
        "output_dir": "/Users/bob/outputs/run",
        "policy": {"path": "C:\\Users\\carol\\act", "repo_id": "alice/act"},
        "notes": ["~/scratch", "relative/dir", "/", f"file://{Path.home()}/notes.txt"],
    }
    (tmp_path / "train_config.json").write_text(json.dumps(config, indent=4))
    copy = neutralize_json(tmp_path / "train_config.json")
    assert copy is not None
    assert copy.fields == ("dataset.root", "output_dir", "policy.path", "notes[0]", "notes[3]")
    assert copy.content == {
        "dataset": {"repo_id": "alice/pick", "root": None},
        "output_dir": None,
        "policy": {"path": None, "repo_id": "alice/act"},
        "notes": [None, "relative/dir", "/", None],
    }
    assert json.loads(copy.data) == copy.content and copy.data.startswith(b'{\n    "dataset"')
    assert json.loads((tmp_path / "train_config.json").read_text()) == config  # the local file is untouched
    (tmp_path / "config.json").write_text('{"type": "act"}')
    assert neutralize_json(tmp_path / "config.json") is None  # nothing local: published as it is


def test_a_dcp_only_step_says_how_to_get_weights(hub: HubEndpoint, runs: dict[str, Path]) -> None:
    proc = _push(hub, str(runs["hsdp"]), "--repo-id", "alice/act-dcp")
    assert proc.returncode == 3
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "only as DCP shards" in proc.stderr and "convert-dcp --checkpoint-dir" in proc.stderr
    assert "--push-to-hub REPO" in proc.stderr and "--whole-step" in proc.stderr
    assert not hub.server.requests  # refused before any request


def test_whole_pushes_refuse_what_cannot_be_published_before_any_request(
    hub: HubEndpoint, runs: dict[str, Path], tmp_path: Path
) -> None:
    step = runs["fsdp"] / layout.CHECKPOINTS_DIR / STEP

    def refused(*args: str, code: int) -> str:
        proc = _push(hub, *args, "--repo-id", "alice/act-refused")
        assert proc.returncode == code, proc.stdout + proc.stderr
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
        return proc.stderr

    assert "give one" in refused(str(step), "--whole-step", "--whole-run", code=2)
    assert "--whole-run needs a run's output dir" in refused(str(step), "--whole-run", code=2)
    # A step whose files are not its save's (a byte of the RNG state changed) is not published.
    copy = tmp_path / "run" / layout.CHECKPOINTS_DIR / STEP
    shutil.copytree(step, copy)
    rng = copy / layout.TRAINING_STATE_DIR / layout.RNG_STATE
    data = bytearray(rng.read_bytes())
    data[-1] ^= 0xFF
    rng.write_bytes(bytes(data))
    line = refused(str(copy), "--whole-step", code=3)
    assert "files that are not from the save that wrote this step" in line and "refusing to publish it" in line
    rng.write_bytes((step / layout.TRAINING_STATE_DIR / layout.RNG_STATE).read_bytes())
    (copy / layout.PRETRAINED_MODEL_DIR / "extra.json").symlink_to(step / layout.PRETRAINED_MODEL_DIR / "config.json")
    assert "not a regular file" in refused(str(copy), "--whole-step", code=3)
    assert not hub.server.requests


@pytest.fixture
def published_step(hub: HubEndpoint, runs: dict[str, Path], tmp_path: Path) -> Path:
    """Step 4 of the FSDP run pushed with --whole-step, then downloaded: the downloaded run dir."""
    proc = _push(hub, str(runs["fsdp"] / layout.CHECKPOINTS_DIR / STEP), "--repo-id", "alice/act-step", "--whole-step")
    assert proc.returncode == 0, proc.stderr
    return _snapshot(hub, "alice/act-step", tmp_path / "downloaded")


def test_whole_step_downloads_as_a_checkpoint_the_tools_and_the_trainer_resume(
    hub: HubEndpoint, runs: dict[str, Path], published_step: Path, tmp_path: Path
) -> None:
    local = runs["fsdp"] / layout.CHECKPOINTS_DIR / STEP
    published = hub.server.files("alice/act-step")
    prefix = f"{layout.CHECKPOINTS_DIR}/{STEP}/"
    assert {n.removeprefix(prefix) for n in published if n.startswith(prefix)} == _step_files(local)
    assert set(published) - {prefix + n for n in _step_files(local)} == {"README.md", ".gitattributes"}
    _assert_no_local_path(published, runs)
    config = f"{layout.PRETRAINED_MODEL_DIR}/{layout.TRAIN_CONFIG}"
    dcp = [f"{layout.PRETRAINED_MODEL_DIR}/{layout.MODEL_DCP_DIR}", f"{layout.TRAINING_STATE_DIR}/optimizer_0"]
    metadata = {f"{d}/{name}" for d in dcp for name in (layout.DCP_METADATA, layout.DCP_INDEX)}
    for rel in _step_files(local) - {config, *metadata, f"{layout.TRAINING_STATE_DIR}/{layout.SAVE_FILES}"}:
        assert published[prefix + rel] == (local / rel).read_bytes(), rel  # every other file as the trainer wrote it

    # The published record says which files are copies, and vouches for the copies' bytes.
    downloaded = published_step / layout.CHECKPOINTS_DIR / STEP
    record = save_files.read(layout.StepPaths(downloaded))
    assert record is not None and record.published_copy[config] == ("dataset.root", "output_dir")
    assert set(record.published_copy) == {config, *metadata}
    assert record.save_id == save_files.read(layout.StepPaths(local)).save_id  # type: ignore[union-attr]
    # torch's checkpoint_id (the local dir the save wrote to) is the directory's place in the run.
    for directory in dcp:
        table = parse_metadata(published[f"{prefix}{directory}/{layout.DCP_METADATA}"])
        assert table.checkpoint_id == f"{prefix}{directory}"
        assert table.save_id == record.save_id

    inspected = run_cli("inspect", str(downloaded), no_torch=True)
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    assert "published with local paths set to null in pretrained_model/" in inspected.stdout
    verified = run_cli("verify-resume", str(downloaded), "--skip-build", "--strict", "--json", no_torch=True)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # The downloaded step resumes (the dataset is local here too) and continues as the local run did.
    nproc, flags = LAYOUTS["fsdp"]
    ok(train("--resume=true", f"--config_path={downloaded}", f"--dataset.root={FIXTURE_DATASET}", *flags, nproc=nproc))
    assert_tensors_equal(gathered_weights(published_step, 8), gathered_weights(runs["fsdp"], 8))


def test_whole_run_publishes_every_step_and_last_as_a_pointer_file(
    hub: HubEndpoint, runs: dict[str, Path], tmp_path: Path
) -> None:
    root = runs["fsdp"] / layout.CHECKPOINTS_DIR
    proc = _push(hub, str(runs["fsdp"]), "--repo-id", "alice/act-run", "--whole-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        lines[0].startswith(f"Pushed {len(_step_files(root / STEP)) * 2 + 2} file(s)")
        and "to alice/act-run" in lines[0]
    )
    copies = next(line for line in lines if line.startswith("  published as copies without local paths: "))
    assert f"{layout.CHECKPOINTS_DIR}/000008/{layout.PRETRAINED_MODEL_DIR}/{layout.TRAIN_CONFIG}" in copies
    published = hub.server.files("alice/act-run")
    expected = {
        f"{layout.CHECKPOINTS_DIR}/{s.name}/{rel}" for s in layout.list_step_dirs(root) for rel in _step_files(s)
    }
    assert set(published) == expected | {f"{layout.CHECKPOINTS_DIR}/last", "README.md", ".gitattributes"}
    assert published[f"{layout.CHECKPOINTS_DIR}/last"] == b"000008"  # the Hub holds no links: a pointer file
    assert "ckpt-train --resume=true --config_path=run/checkpoints/000008" in published["README.md"].decode()
    _assert_no_local_path(published, runs)
    # The tools read that pointer on the Hub: moved back to 000004 (a commit of the real client),
    # a run's root on the Hub means the step it names, not the newest.
    older = tmp_path / "pointer"
    (older / layout.CHECKPOINTS_DIR).mkdir(parents=True)
    (older / layout.CHECKPOINTS_DIR / layout.LAST_LINK).write_bytes(b"000004")
    upload(hub.env, older, "alice/act-run")
    seen = run_cli("inspect", "hf://alice/act-run", "--json", env=hub.env, no_torch=True)
    assert seen.returncode == 0, seen.stderr
    assert json.loads(seen.stdout)["step"] == 4


def test_dry_run_contacts_nothing_and_shows_files_copies_and_card(
    hub: HubEndpoint, runs: dict[str, Path], tmp_path: Path
) -> None:
    step = runs["fsdp"] / layout.CHECKPOINTS_DIR / STEP
    nowhere = {**hub.env, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    args = ("push", str(step), "--repo-id", "alice/act-dry", "--whole-step", "--dry-run")
    text = run_cli(*args, env=nowhere, no_torch=True)
    assert text.returncode == 0, text.stderr
    as_json = run_cli(*args, "--json", env=nowhere, no_torch=True)
    assert as_json.returncode == 0, as_json.stderr
    assert not hub.server.requests

    plan = json.loads(as_json.stdout)
    config = f"{layout.CHECKPOINTS_DIR}/{STEP}/{layout.PRETRAINED_MODEL_DIR}/{layout.TRAIN_CONFIG}"
    sources = {f["path"]: f["source"] for f in plan["files"]}
    assert set(sources) == {f"{layout.CHECKPOINTS_DIR}/{STEP}/{n}" for n in _step_files(step)} | {"README.md"}
    assert sources[config].endswith("(copy: local paths set to null in dataset.root, output_dir)")
    metadata = f"{layout.CHECKPOINTS_DIR}/{STEP}/{layout.PRETRAINED_MODEL_DIR}/{layout.MODEL_DCP_DIR}/.metadata"
    assert sources[metadata].endswith("(copy: storage_meta.checkpoint_id made the directory's place in the repo)")
    weights = f"{layout.CHECKPOINTS_DIR}/{STEP}/{layout.PRETRAINED_MODEL_DIR}/{layout.MODEL_WEIGHTS}"
    assert sources[weights] == str(step / layout.PRETRAINED_MODEL_DIR / layout.MODEL_WEIGHTS)
    copy = json.loads(plan["rewritten"][config]["content"])
    assert copy["dataset"]["root"] is None and copy["output_dir"] is None

    # The text output shows the same: each file with its size and source, the copy, then the card.
    assert text.stdout.startswith(f"Dry run: would push {len(plan['files'])} file(s)")
    assert "nothing was contacted" in text.stdout.splitlines()[0]
    assert f"  {weights}" in text.stdout and "--- README.md (generated model card) ---" in text.stdout
    assert plan["card"].splitlines()[-3] in text.stdout and '"root": null' in text.stdout
    for path in _local_paths(runs):
        assert path.decode() not in plan["card"] and path.decode() not in plan["rewritten"][config]["content"]

    # What the dry run shows is what a push sends.
    assert _push(hub, str(step), "--repo-id", "alice/act-dry", "--whole-step").returncode == 0
    published = hub.server.files("alice/act-dry")
    assert published["README.md"].decode() == plan["card"]
    assert published[config].decode() == plan["rewritten"][config]["content"]
    assert {p: len(published[p]) for p in sources} == {f["path"]: f["size"] for f in plan["files"]}
