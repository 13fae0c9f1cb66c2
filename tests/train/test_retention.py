"""Retention and the `last` pointer file on a real run: one 2-process FSDP run with asynchronous saves,
``--checkpoint.keep_last_n=2`` and ``--checkpoint.last_link=file`` (module-scoped), then the trainer's
resume, the tools and ``ckpt-tools prune`` on copies of it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt_tools.format import layout
from ckpt_tools.io.dir_lock import DirLock
from ckpt_tools.retention import PAUSE_ENV
from ckpt_tools.retention.lease import reading
from devtools.procs import REPO, launch_env, run_cli
from devtools.training import TINY, ok, train
from tests.support.cli import invoke_cli

pytestmark = pytest.mark.torchrun

FLAGS = [
    *TINY,
    "--parallelism.dp_shard=2",
    "--checkpoint_format=safetensors_dcp",
    "--checkpoint_async=true",
    "--save_freq=1",
    "--checkpoint.keep_last_n=2",
    "--checkpoint.last_link=file",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("retention") / "run"
    proc = ok(train(*FLAGS, "--steps=4", f"--output_dir={out}", nproc=2))
    return out, proc.stdout


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def copy_run(run: tuple[Path, str], tmp_path: Path, extra_steps: tuple[str, ...] = ()) -> Path:
    """A copy of the run (its own run), with ``extra_steps`` made as copies of its oldest step."""
    copy = tmp_path / "run"
    shutil.copytree(run[0], copy, symlinks=True)
    root = copy / layout.CHECKPOINTS_DIR
    for name in extra_steps:
        shutil.copytree(root / "000003", root / name)
    return copy


def test_async_saves_keep_the_newest_two_and_last_is_a_pointer_file(run: tuple[Path, str]) -> None:
    out, stdout = run
    root = out / layout.CHECKPOINTS_DIR
    assert names(root) == ["000003", "000004", "last"]  # nothing hidden left either: no .deleting, no lease
    assert not (root / "last").is_symlink() and (root / "last").read_text() == "000004\n"
    assert "checkpoint retention (--checkpoint.keep_last_n=2): removed 000001" in stdout
    assert "checkpoint retention (--checkpoint.keep_last_n=2): removed 000002" in stdout
    assert stdout.count("committed") == 4  # every save was a background one
    saved = json.loads((root / "000004" / "pretrained_model" / "train_config.json").read_text())
    assert saved["checkpoint"] == {"keep_last_n": 2, "last_link": "file", "load_from": None, "load": None}


def test_every_tool_reads_the_pointer_file(run: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = run
    root = out / layout.CHECKPOINTS_DIR
    inspected = invoke_cli("inspect", str(out))
    assert inspected.returncode == 0, inspected.stdout
    assert "ok   last link: last -> 000004 (pointer file)" in inspected.stdout
    assert (
        "retention (keep_last_n=2, from 000004/pretrained_model/train_config.json): would remove nothing"
        in inspected.stdout
    )
    assert "would remove 000003" in invoke_cli("inspect", str(out), "--keep-last", "1").stdout
    verified = invoke_cli("verify-resume", str(root / "last"), "--skip-build")
    assert verified.returncode == 0 and "(step 4)" in verified.stdout, verified.stdout
    assert invoke_cli("reshard-plan", str(out), "--nproc", "2").returncode == 0
    converted = invoke_cli("convert-dcp", str(root / "last"), "--output", str(tmp_path / "conv"), "--quiet")
    assert converted.returncode == 0, converted.stderr
    assert (tmp_path / "conv" / "model.safetensors").is_file()
    assert names(root) == ["000003", "000004", "last"]  # the readers' leases are gone with them


def test_the_trainer_resumes_from_the_pointer_file_and_moves_it(run: tuple[Path, str], tmp_path: Path) -> None:
    copy = copy_run(run, tmp_path)
    root = copy / layout.CHECKPOINTS_DIR
    # One process (resharded from the run's two): the cheapest launch that still reads `last` itself.
    # --resume=true reads the pointer file it is given; --resume=auto's own read of `last` is the next test's.
    flags = ["--parallelism.dp_shard=1", "--checkpoint_format=safetensors", "--steps=5"]
    proc = ok(train("--resume=true", f"--config_path={root / 'last'}", *flags))
    assert f"resumed from {root / '000004'} at step 4" in proc.stdout
    assert names(root) == ["000004", "000005", "last"]
    assert (root / "last").read_text() == "000005\n"


def test_the_trainer_refuses_a_hostile_pointer_in_one_line(run: tuple[Path, str], tmp_path: Path) -> None:
    copy = copy_run(run, tmp_path)
    (copy / layout.CHECKPOINTS_DIR / "last").write_text("../../etc")
    proc = train("--resume=auto", f"--output_dir={copy}", *TINY, "--steps=5")
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "not a 'last' pointer ('../../etc' is not the name of a step directory beside it)" in proc.stderr


def test_prune_dry_run_then_real(run: tuple[Path, str], tmp_path: Path) -> None:
    copy = copy_run(run, tmp_path, ("000001", "000002"))
    root = copy / layout.CHECKPOINTS_DIR
    dry = invoke_cli("prune", str(copy), "--keep-last", "2", "--dry-run")
    assert dry.returncode == 0
    assert dry.stdout.splitlines() == [
        f"{root}: keep the newest 2 (dry run: nothing is removed)",
        "  would remove 000001",
        "  would remove 000002",
        "  kept 000003: within the newest 2",
        "  kept 000004: last, newest resumable, within the newest 2",
        "would remove 2 step(s), kept 2",
    ]
    assert names(root) == ["000001", "000002", "000003", "000004", "last"]
    real = invoke_cli("prune", str(root), "--keep-last", "1", "--json")
    assert real.returncode == 0
    doc = json.loads(real.stdout)
    assert doc["removed"] == ["000001", "000002", "000003"]
    assert doc["kept"] == {"000004": ["last", "newest resumable", "within the newest 1"]}
    assert names(root) == ["000004", "last"]
    assert invoke_cli("verify-resume", str(copy), "--skip-build").returncode == 0


def test_prune_is_refused_while_a_trainer_owns_the_run(run: tuple[Path, str], tmp_path: Path) -> None:
    copy = copy_run(run, tmp_path, ("000001",))
    with DirLock(copy, "ckpt-train"):  # the run lock a live trainer holds (own_output_dir)
        out = invoke_cli("prune", str(copy), "--keep-last", "1")
    assert out.returncode == 4
    assert out.stderr.strip().splitlines() == [
        f"error: {copy} is in use by ckpt-train (process {os.getpid()} on {os.uname().nodename});"
        " nothing removed: prune a run once its trainer has ended"
    ]
    assert names(copy / layout.CHECKPOINTS_DIR) == ["000001", "000003", "000004", "last"]


def test_prune_keeps_a_step_a_live_reader_holds_and_ignores_a_dead_readers_lease(
    run: tuple[Path, str], tmp_path: Path
) -> None:
    copy = copy_run(run, tmp_path, ("000001",))
    root = copy / layout.CHECKPOINTS_DIR
    with reading(root / "000001", "convert-dcp"):
        out = invoke_cli("prune", str(copy), "--keep-last", "1")
    assert "  kept 000001: in use" in out.stdout and "  removed 000003" in out.stdout
    assert names(root)[:2] == ["000001", "000004"]
    # A reader killed outright leaves its lease: its process is gone, so the lease no longer holds.
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LEASE, str(root / "000001")],
        env=launch_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    assert "  kept 000001: in use" in invoke_cli("prune", str(copy), "--keep-last", "1", "--dry-run").stdout
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    pruned = invoke_cli("prune", str(copy), "--keep-last", "1").stdout
    assert "  removed 000001" in pruned and "  note: removed the leases of readers that were killed" in pruned
    assert names(root) == ["000004", "last"]


HOLD_LEASE = """
import sys, time
from pathlib import Path
from ckpt_tools.retention.lease import reading
lease = reading(Path(sys.argv[1]), "push")
lease.__enter__()
print("held", flush=True)
time.sleep(120)
"""


def test_a_kill_during_the_removal_leaves_no_half_step_and_a_rerun_finishes(
    run: tuple[Path, str], tmp_path: Path
) -> None:
    copy = copy_run(run, tmp_path, ("000001", "000002"))
    root = copy / layout.CHECKPOINTS_DIR
    prune = subprocess.Popen(
        [sys.executable, "-m", "ckpt_tools.cli", "prune", str(copy), "--keep-last", "2"],
        env=launch_env({PAUSE_ENV: "60"}),
        cwd=REPO,
    )
    deadline = time.monotonic() + 60
    while not any(".deleting-" in n for n in names(root)) and time.monotonic() < deadline:
        time.sleep(0.05)
    prune.send_signal(signal.SIGKILL)  # between the rename and the removal
    prune.wait()
    aside = [n for n in names(root) if ".deleting-" in n]
    assert len(aside) == 1 and aside[0].startswith(".000001.deleting-")
    assert [p.name for p in layout.list_step_dirs(root)] == ["000002", "000003", "000004"]  # each one whole
    inspected = run_cli("inspect", str(root))
    assert "000001/ moved aside by an interrupted deletion" in inspected.stdout
    rerun = invoke_cli("prune", str(copy), "--keep-last", "2")
    assert rerun.returncode == 0
    assert "  note: finished removing 000001/, left by an interrupted removal" in rerun.stdout
    assert "  removed 000002" in rerun.stdout
    assert names(root) == ["000003", "000004", "last"]
