"""``convert-dcp --delete-dcp`` never destroys the only copy: on real trainer checkpoints (the ``runs`` fixture).

The HSDP 2×2 run saves with ``--checkpoint_format=dcp``: its weights exist only as DCP shards,
so deleting them is safe exactly when the conversion is what the trainer resumes from,
bit-exactly. Each test copies the run's checkpoints into ``tmp_path``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_tools.cli.convert import run_convert
from ckpt_tools.cli.lerobot_convert_dcp import convert_dcp_main
from ckpt_tools.convert import convert_dcp
from ckpt_tools.errors import UsageError
from ckpt_tools.format import layout as L
from ckpt_tools.inspect import inspect_path
from ckpt_tools.io.dir_lock import LOCK_NAME
from ckpt_tools.io.fsutil import TEMP_SUFFIX, find_leftovers
from ckpt_tools.resume.verify import verify_resume
from devtools.procs import launch_env
from devtools.training import ok, train
from tests.support.dcp_fixtures import tree_digest

STEP = "000008"


@pytest.fixture
def root(runs: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of the HSDP run's checkpoints root (``last -> 000008``)."""
    return Path(shutil.copytree(runs["hsdp"] / L.CHECKPOINTS_DIR, tmp_path / "run" / L.CHECKPOINTS_DIR, symlinks=True))


def model_dcp(step: Path) -> Path:
    return step / L.PRETRAINED_MODEL_DIR / L.MODEL_DCP_DIR


def resumes_exactly(step: Path) -> bool:
    return verify_resume(step, strict=True).resumable


# ---------------------------------------------------------------- what may be deleted


def test_the_default_conversion_deletes_and_what_remains_resumes_exactly(root: Path) -> None:
    step = root / STEP
    assert resumes_exactly(step)
    result = convert_dcp(step, delete_dcp=True, progress=False)
    assert result.deleted_dcp and not model_dcp(step).exists()
    assert resumes_exactly(step)
    assert find_leftovers(step / L.PRETRAINED_MODEL_DIR) == []  # the moved-aside copy is gone too


def test_an_output_inside_the_shards_is_refused(root: Path) -> None:
    step = root / STEP
    before = tree_digest(step)
    with pytest.raises(UsageError, match=r"inside .*pytorch_model_fsdp_0, which would be deleted with it"):
        convert_dcp(step, output=model_dcp(step) / "export", delete_dcp=True, progress=False)
    assert tree_digest(step) == before


def test_deleting_the_optimizer_shards_needs_allow_unresumable(root: Path) -> None:
    step = root / STEP
    before = tree_digest(step)
    with pytest.raises(UsageError, match=r"only optimizer state a resume reads.*--allow-unresumable"):
        convert_dcp(step, what="optimizer", delete_dcp=True, progress=False)
    assert tree_digest(step) == before  # refused before anything was written
    result = convert_dcp(step, what="optimizer", delete_dcp=True, allow_unresumable=True, progress=False)
    assert result.deleted_dcp and not (step / L.TRAINING_STATE_DIR / L.OPTIMIZER_DCP_DIR).exists()
    assert not verify_resume(step).resumable  # what the flag accepted: verify-resume agrees


def test_a_cast_conversion_keeps_the_fp32_masters_and_verify_resume_flags_one_without(root: Path) -> None:
    step = root / STEP
    before = tree_digest(step)
    with pytest.raises(UsageError, match=r"bfloat16 where training holds them in float32.*--allow-unresumable"):
        convert_dcp(step, dtype="bf16", delete_dcp=True, progress=False)
    assert tree_digest(step) == before
    convert_dcp(step, dtype="bf16", delete_dcp=True, allow_unresumable=True, progress=False)
    assert verify_resume(step).resumable  # the trainer still loads it (casting back to fp32) ...
    strict = verify_resume(step, strict=True)
    assert not strict.resumable  # ... but not bit-exactly
    (check,) = [c for c in strict.checks if c.name == "weights-precision"]
    assert check.status == "warn" and "does not continue bit-exactly" in check.message


def test_the_trainer_warns_as_verify_resume_does_when_the_weights_were_cast(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """One rule (``master_copy_problem``) for both: the FSDP run's step 4 with its fp32 shards replaced by bf16."""
    out = tmp_path / "resumed"
    step = Path(shutil.copytree(runs["fsdp"] / L.CHECKPOINTS_DIR / "000004", out / L.CHECKPOINTS_DIR / "000004"))
    convert_dcp(step, dtype="bf16", overwrite=True, delete_dcp=True, allow_unresumable=True, progress=False)
    (check,) = [c for c in verify_resume(step).checks if c.name == "weights-precision"]
    assert check.status == "warn"
    config = step / L.PRETRAINED_MODEL_DIR / L.TRAIN_CONFIG
    proc = ok(train("--resume=true", f"--config_path={config}", f"--output_dir={out}", nproc=2))
    assert "warning: model.safetensors: " in proc.stdout and "does not continue bit-exactly" in proc.stdout


def test_a_symlinked_pretrained_model_is_not_followed_out_of_the_step(root: Path, tmp_path: Path) -> None:
    step = root / STEP
    elsewhere = tmp_path / "elsewhere" / L.PRETRAINED_MODEL_DIR
    shutil.move(step / L.PRETRAINED_MODEL_DIR, elsewhere)
    os.symlink(elsewhere, step / L.PRETRAINED_MODEL_DIR)
    before = tree_digest(elsewhere)
    with pytest.raises(UsageError, match="outside"):
        convert_dcp(step, delete_dcp=True, progress=False)
    assert tree_digest(elsewhere) == before


def test_a_last_link_out_of_the_checkpoints_root_is_not_followed(root: Path, tmp_path: Path) -> None:
    outside = Path(shutil.move(root / STEP, tmp_path / "elsewhere" / STEP))
    (root / L.LAST_LINK).unlink()
    os.symlink(outside, root / L.LAST_LINK)
    before = tree_digest(outside)
    for named in (root, root / L.LAST_LINK):
        with pytest.raises(UsageError, match="outside"):
            convert_dcp(named, delete_dcp=True, progress=False)
    assert tree_digest(outside) == before


def test_the_push_path_refuses_before_converting_or_pushing(root: Path) -> None:
    step = root / STEP
    before = tree_digest(step)
    with pytest.raises(UsageError, match=r"bit-exactly.*--allow-unresumable"):  # refused before the Hub is called
        run_convert(step, dtype="bf16", delete_dcp=True, push_to_hub="alice/tiny", quiet=True)
    assert tree_digest(step) == before


def test_the_lerobot_spelling_takes_allow_unresumable(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    step = root / STEP
    argv = [f"--checkpoint_dir={step}", "--what=optimizer", "--delete_dcp=true", "--quiet=true"]
    with pytest.raises(SystemExit) as refused:
        convert_dcp_main(argv)
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.count("\n") == 1 and "--allow-unresumable" in err
    convert_dcp_main([*argv, "--allow_unresumable=true"])
    assert not (step / L.TRAINING_STATE_DIR / L.OPTIMIZER_DCP_DIR).exists()


# ---------------------------------------------------------------- interrupted deletions


class Interrupt:
    """Stops the removals of the shards at the ``at``-th one (KeyboardInterrupt: what SIGTERM and Ctrl-C raise).

    The conversion's own temporaries and its lock on the output directory are removed too,
    before and after the deletion: those removals do not count.
    """

    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0

    def wrap(self, real: Any) -> Any:
        def removal(*args: Any, **kwargs: Any) -> Any:
            name = Path(str(args[0] if args else kwargs.get("path", ""))).name
            if name == LOCK_NAME or name.endswith(TEMP_SUFFIX):  # not the shards': the lock, a temporary
                return real(*args, **kwargs)
            self.calls += 1
            if self.calls == self.at:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        return removal


@pytest.fixture
def interrupt(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def arm(at: int) -> Interrupt:
        stop = Interrupt(at)
        monkeypatch.setattr(os, "unlink", stop.wrap(os.unlink))
        monkeypatch.setattr(os, "rmdir", stop.wrap(os.rmdir))
        return stop

    yield arm
    monkeypatch.undo()


def test_a_delete_interrupted_at_every_file_leaves_the_old_or_the_new_state(
    root: Path, tmp_path: Path, interrupt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Removal number k (every file, then the directory) raises: old state or new one, and a rerun finishes."""
    pristine = root / STEP
    shards = tree_digest(model_dcp(pristine))
    reference = convert_dcp(pristine, output=tmp_path / "reference", progress=False).output_files[0].read_bytes()
    points, old, new, lost = 0, 0, 0, 0
    for k in range(1, 100):
        step = Path(shutil.copytree(pristine, tmp_path / f"k{k}" / STEP, symlinks=True))
        weights = step / L.PRETRAINED_MODEL_DIR / L.MODEL_WEIGHTS
        stop = interrupt(k)
        try:
            convert_dcp(step, delete_dcp=True, progress=False)
        except KeyboardInterrupt:
            pass
        finally:
            monkeypatch.undo()
        if stop.calls < k:  # the deletion finished before removal k: every point was tried
            shutil.rmtree(step.parent)
            break
        points += 1
        dcp_whole = model_dcp(step).is_dir() and tree_digest(model_dcp(step)) == shards
        converted = weights.is_file() and weights.read_bytes() == reference
        assert dcp_whole or (not model_dcp(step).exists() and converted), f"interrupted at removal {k}: a broken state"
        lost += not (dcp_whole or converted)
        old += dcp_whole
        if not dcp_whole:
            new += 1
            assert verify_resume(step, strict=True).resumable  # the new state, leftover or not
            (leftover,) = inspect_path(step).leftovers
            assert leftover.startswith(f"pretrained_model/.{L.MODEL_DCP_DIR}.deleting-")
        rerun = convert_dcp(step, delete_dcp=True, progress=False)
        assert rerun.deleted_dcp and not model_dcp(step).exists() and weights.read_bytes() == reference
        assert inspect_path(step).leftovers == [] and resumes_exactly(step)
        shutil.rmtree(step.parent)
    assert points == len(shards) + 1 and lost == 0  # every shard file, .metadata, then the directory
    assert new == points and old == 0  # removals start only after the atomic move aside


def test_a_delete_interrupted_before_the_move_keeps_the_shards_and_a_rerun_finishes(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = root / STEP
    real_replace = os.replace

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        if Path(src).name == L.MODEL_DCP_DIR:
            raise KeyboardInterrupt
        real_replace(src, dst, **kwargs)

    shards = tree_digest(model_dcp(step))
    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", replace)
        with pytest.raises(KeyboardInterrupt):
            convert_dcp(step, delete_dcp=True, progress=False)
    assert tree_digest(model_dcp(step)) == shards  # the old state: shards whole, the conversion committed
    rerun = convert_dcp(step, delete_dcp=True, progress=False)  # keeps the identical output, then deletes
    assert rerun.deleted_dcp and any("already holds exactly these tensors" in n for n in rerun.notes)
    assert resumes_exactly(step)


# ---------------------------------------------------------------- leftovers of killed writers


def test_inspect_names_a_killed_writers_temporary_and_a_rerun_removes_it(root: Path) -> None:
    step = root / STEP
    pm = step / L.PRETRAINED_MODEL_DIR
    kill = (
        "import os, signal, sys\nfrom pathlib import Path\nfrom ckpt_tools.io.fsutil import TempSibling\n"
        "t = TempSibling(Path(sys.argv[1]))\nos.write(t.fd, b'half a header')\nos.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", kill, str(pm / L.MODEL_WEIGHTS)], env=launch_env(), timeout=60)
    assert proc.returncode == -signal.SIGKILL
    (tmp,) = [p for p in pm.iterdir() if p.name.startswith(f".{L.MODEL_WEIGHTS}.")]
    for path in (step, root):  # the step, and the checkpoints root that inspects it
        report = inspect_path(path)
        assert [Path(p).name for p in report.leftovers] == [tmp.name]
        (check,) = [c for c in report.checks if c.name.endswith("leftover")]
        assert check.status == "warn" and "interrupted write of model.safetensors" in check.message
        assert report.healthy
    result = convert_dcp(step, progress=False)
    assert not tmp.exists() and any(tmp.name in n for n in result.notes)
    assert inspect_path(step).leftovers == []
