"""``ckpt-tools push`` and ``publish_checkpoint`` against the loopback Hub, with the real huggingface_hub client.

Each push runs in its own process (the client reads HF_ENDPOINT and friends at import), and
the assertions are on what the server received: the commit's operations, the bytes of every
file, the requests made - and on what the user's folder still holds afterwards.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from safetensors.numpy import load

from ckpt_tools.format import layout
from devtools.procs import run_cli
from tests.fakes.hub.server import iter_commit_ops
from tests.support.dcp_fixtures import save_model_dcp
from tests.support.hub_data import (
    PUBLISHED,
    StepDir,
    assert_published_as_local,
    make_step_dir,
    tree_digest,
    weights,
)
from tests.support.hub_fixtures import HUB_ORG, HubEndpoint, assert_token_absent, hf_download

REPO = "alice/act-pick-place"
NEVER_SENT = ("pytorch_model_fsdp_0", "training_state", "optimizer_0", ".distcp", ".metadata", ".tmp", "notes.txt")


def _push(hub: HubEndpoint, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("push", *args, env=env or hub.env, no_torch=True)


def test_push_uploads_exactly_the_publishable_files(hub: HubEndpoint, tmp_path: Path) -> None:
    server, env = hub.server, hub.env
    step = make_step_dir(tmp_path)
    before = tree_digest(tmp_path)

    proc = _push(hub, str(step.root), "--repo-id", REPO, "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)

    # The commit holds the publishable files plus the generated card, and nothing else.
    ops = list(iter_commit_ops(server, REPO))
    assert sorted(op.path for op in ops) == sorted([*PUBLISHED, "README.md"])
    assert {op.path for op in ops if op.key == "lfsFile"} == {p for p in PUBLISHED if p.endswith(".safetensors")}
    files = server.files(REPO)
    assert set(files) == {*PUBLISHED, "README.md", ".gitattributes"}
    assert_published_as_local(files, step)  # train_config.json: a copy, its local paths null
    # Only those bytes went over the wire: LFS objects are exactly the two safetensors files.
    assert sorted(r.body for r in server.requests_for("lfs_put")) == sorted(
        (step.pretrained_model / p).read_bytes() for p in PUBLISHED if p.endswith(".safetensors")
    )
    for request in server.requests:
        assert not any(marker in request.path for marker in NEVER_SENT), request.path
        assert not any(marker.encode() in request.body for marker in NEVER_SENT[:3]), request.route
        assert request.route != "unknown", request.path
        assert request.status == 200, (request.route, request.status)
        if request.route != "lfs_put":  # the upload URL is presigned; everything else is authenticated
            assert request.user == "alice", request.route
    assert not server.repo(REPO).private

    # The JSON result says what was sent, as the server saw it.
    assert result["repo_id"] == REPO and result["revision"] == "main" and result["card"] == "generated"
    assert result["commit_oid"] == server.repo(REPO).branches["main"]
    assert {f["path"]: f["size"] for f in result["files"]} == {n: len(files[n]) for n in [*PUBLISHED, "README.md"]}
    assert set(result["skipped"]) == {".model.safetensors.x1y2.tmp", "notes.txt", "pytorch_model_fsdp_0/"}

    # The card arrived, without local paths; the user's folder did not change and got no README.
    card = files["README.md"].decode()
    assert "| Layout | HSDP over 2×2 (dp_replicate×dp_shard), 1 node |" in card
    assert str(tmp_path) not in card and str(step.dataset_root) not in card
    assert tree_digest(tmp_path) == before

    # A download through the real client returns the same bytes.
    downloaded = hf_download(env, REPO, "model.safetensors")
    assert downloaded.read_bytes() == (step.pretrained_model / "model.safetensors").read_bytes()
    assert_token_absent(hub.token, [tmp_path, hub.hf_home], [proc.stdout, proc.stderr])
    assert all(hub.token.encode() not in r.body for r in server.requests)


def test_private_push_to_a_branch(hub: HubEndpoint, tmp_path: Path) -> None:
    server, env = hub.server, hub.env
    step = make_step_dir(tmp_path)
    proc = _push(hub, str(step.pretrained_model), "--repo-id", REPO, "--private", "--revision", "step-5000")
    assert proc.returncode == 0, proc.stderr
    assert f"to {REPO} (step-5000, private)" in proc.stdout

    assert server.requests_for("create_repo")[0].json()["visibility"] == "private"
    repo = server.repo(REPO)
    assert repo.private
    assert set(server.files(REPO, "main")) == {".gitattributes"}
    assert set(server.files(REPO, "step-5000")) == {*PUBLISHED, "README.md", ".gitattributes"}
    # A private repo is not readable anonymously, and readable with the token.
    anonymous = {k: v for k, v in env.items() if k != "HF_TOKEN"}
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "from huggingface_hub import hf_hub_download as d; d('alice/act-pick-place', 'config.json')",
        ],
        env=anonymous,
        capture_output=True,
        text=True,
    )
    assert probe.returncode != 0 and "RepositoryNotFound" in probe.stderr
    downloaded = hf_download(env, REPO, "config.json", revision="step-5000")
    assert downloaded.read_bytes() == (step.pretrained_model / "config.json").read_bytes()


def test_private_push_to_an_existing_public_repo_is_refused(hub: HubEndpoint, tmp_path: Path) -> None:
    server = hub.server
    server.seed_repo(REPO, {"README.md": b"# public\n"})
    step = make_step_dir(tmp_path)
    proc = _push(hub, str(step.root), "--repo-id", REPO, "--private")
    assert proc.returncode == 5
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert "already exists and is public" in proc.stderr
    assert not server.requests_for("preupload") and not server.requests_for("commit")


def test_repush_sends_nothing_new_and_a_users_readme_is_kept(hub: HubEndpoint, tmp_path: Path) -> None:
    server = hub.server
    step = make_step_dir(tmp_path)
    assert _push(hub, str(step.root), "--repo-id", REPO).returncode == 0
    commits = len(server.repo(REPO).history())
    puts = len(server.requests_for("lfs_put"))

    again = _push(hub, str(step.root), "--repo-id", REPO, "--json")
    assert again.returncode == 0, again.stderr
    assert len(server.repo(REPO).history()) == commits  # nothing changed: no new commit
    assert len(server.requests_for("lfs_put")) == puts  # and no bytes re-sent
    assert json.loads(again.stdout)["commit_oid"] == server.repo(REPO).branches["main"]

    readme = b"---\nlicense: mit\n---\n# My own card\n"
    (step.pretrained_model / "README.md").write_bytes(readme)
    kept = _push(hub, str(step.root), "--repo-id", REPO, "--json")
    assert kept.returncode == 0, kept.stderr
    assert json.loads(kept.stdout)["card"] == "user"
    assert server.files(REPO)["README.md"] == readme


def test_token_from_the_token_file_and_a_refused_token(hub: HubEndpoint, tmp_path: Path) -> None:
    server, env = hub.server, hub.env
    step = make_step_dir(tmp_path)
    token_file = hub.hf_home / "token"
    token_file.write_text(hub.token)
    from_file = {k: v for k, v in env.items() if k != "HF_TOKEN"}
    proc = _push(hub, str(step.root), "--repo-id", REPO, env=from_file)
    assert proc.returncode == 0, proc.stderr
    assert server.requests_for("commit")[0].user == "alice"
    assert_token_absent(hub.token, [tmp_path, hub.hf_home], [proc.stdout, proc.stderr], exclude=(token_file,))

    wrong = "hf_" + "0" * 32
    refused = _push(hub, str(step.root), "--repo-id", "alice/other", env={**env, "HF_TOKEN": wrong})
    assert refused.returncode == 5
    assert refused.stderr.startswith("error: Hub push to alice/other failed (create the repo): HTTP 401")
    assert refused.stderr.count("\n") == 1 and wrong not in refused.stderr + refused.stdout
    assert not server.has_repo("alice/other")


def _dcp_only_step_dir(base: Path) -> StepDir:
    """A step dir whose weights exist only as real DCP shards (a ``--checkpoint_format=dcp`` save)."""
    step = make_step_dir(base)
    pm = step.pretrained_model
    shutil.rmtree(pm / layout.MODEL_DCP_DIR)
    save_model_dcp(pm / layout.MODEL_DCP_DIR, weights(0))
    (pm / layout.MODEL_WEIGHTS).unlink()
    return step


def test_publish_checkpoint_converts_pushes_then_deletes_and_keeps_shards_on_failure(
    hub: HubEndpoint, tmp_path: Path
) -> None:
    server, env = hub.server, hub.env
    code = (
        "import json, sys\nfrom ckpt_tools.errors import HubError\nfrom ckpt_tools.hub import publish_checkpoint\n"
        "try:\n    r = publish_checkpoint(sys.argv[1], sys.argv[2], private=True, delete_dcp=True, progress=False)\n"
        "except HubError as e:\n    print('HubError', e.exit_code.value, e)\nelse:\n"
        "    print(json.dumps(r.to_dict()))\n"
    )

    def call(path: Path, repo_id: str) -> str:
        proc = subprocess.run([sys.executable, "-c", code, str(path), repo_id], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().splitlines()[-1]

    step = _dcp_only_step_dir(tmp_path / "a")
    org_repo = f"{HUB_ORG}/act"
    result = json.loads(call(step.checkpoints, org_repo))  # the root: its `last`
    assert result["hub"]["repo_id"] == org_repo and result["hub"]["private"] is True
    assert result["conversion"]["verified"] is True and result["conversion"]["deleted_dcp"] is True
    assert server.repo(org_repo).private
    commit = server.repo(org_repo).resolve("main")
    assert commit is not None and commit.message == "Upload converted checkpoint with ckpt-tools"
    sent = load(server.files(org_repo)["model.safetensors"])
    assert sent.keys() == weights(0).keys() and all((sent[k] == v).all() for k, v in weights(0).items())
    assert not (step.pretrained_model / layout.MODEL_DCP_DIR).exists()  # deleted after the push

    kept = _dcp_only_step_dir(tmp_path / "b")
    shards = tree_digest(kept.pretrained_model / layout.MODEL_DCP_DIR)
    forbidden = call(kept.root, "bob/act")
    assert forbidden.startswith("HubError 5 Hub push to bob/act failed (create the repo): HTTP 403")
    assert not server.has_repo("bob/act")
    assert tree_digest(kept.pretrained_model / layout.MODEL_DCP_DIR) == shards  # a failed push deletes nothing
    assert (kept.pretrained_model / layout.MODEL_WEIGHTS).is_file()  # the verified conversion stays
