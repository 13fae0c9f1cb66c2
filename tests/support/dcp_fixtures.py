"""Real DCP checkpoints written by torch under torchrun, and helpers to damage and compare them.

:func:`write_checkpoints` launches ``tests/support/dcp_writer.py`` on 4 ranks; the session
fixture ``ckpts`` of ``tests/conftest.py`` calls it once, and every test that mutates a
checkpoint works on a copy.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devtools.procs import launch_env, torchrun_command

WRITER = Path(__file__).with_name("dcp_writer.py")


def write_checkpoints(out: Path) -> Path:
    """Fill ``out`` with the variants ``dcp_writer.py`` writes (see its docstring)."""
    proc = subprocess.run(
        torchrun_command(str(WRITER), [str(out)], nproc=4),
        env=launch_env({"PYTHONWARNINGS": "ignore"}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    # DONE is written by rank 0 after the last barrier: everything is on disk even if gloo's
    # teardown aborts a process afterwards (see ckpt_tools.train.parallel.distributed.teardown).
    if not (out / "DONE").exists():
        raise RuntimeError(f"dcp_writer failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return out


# Paths of the variants inside the written directory.
FSDP2_STEP = "fsdp2/checkpoints/000010"
FSDP2_DCP = f"{FSDP2_STEP}/pretrained_model/pytorch_model_fsdp_0"
FSDP2_OPT = f"{FSDP2_STEP}/training_state/optimizer_0"
FSDP3_DCP = "fsdp3/pytorch_model_fsdp_0"
HSDP_STEP = "hsdp/checkpoints/000004"
HSDP_DCP = f"{HSDP_STEP}/pretrained_model/pytorch_model_fsdp_0"
SHARD2D_DCP = "shard2d/pytorch_model_fsdp_0"
PEFT_STEP = "peft/checkpoints/000002"
MODEL_DCPS = (FSDP2_DCP, FSDP3_DCP, HSDP_DCP, SHARD2D_DCP)


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path → digest), symlinks by target."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def rewrite_metadata(dcp_dir: Path, edit: Callable[[Any], None]) -> None:
    """Load ``.metadata`` with torch's own classes (trusted: torch wrote it), edit, save back."""
    import torch.distributed.checkpoint.filesystem  # noqa: F401  (registers _StorageInfo for pickle)

    path = dcp_dir / ".metadata"
    with open(path, "rb") as f:
        metadata = pickle.load(f)
    edit(metadata)
    with open(path, "wb") as f:
        pickle.dump(metadata, f)


def torch_reference(dcp_dir: Path, scratch: Path) -> dict[str, Any]:
    """torch's own conversion: ``dcp_to_torch_save`` then ``torch.load``."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = scratch / f"ref-{hashlib.sha1(str(dcp_dir).encode()).hexdigest()[:10]}.pt"
    if not target.exists():
        dcp_to_torch_save(dcp_dir, target)
    return torch.load(target, weights_only=True)


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def save_model_dcp(directory: Path, arrays: dict[str, Any]) -> None:
    """Real DCP shards of ``arrays`` (numpy) under accelerate's ``model`` key, written by torch in-process."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    state = {"model": {name: torch.from_numpy(value) for name, value in arrays.items()}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "torch.distributed is disabled ... a single process"
        dcp.save(state, checkpoint_id=directory, no_dist=True)
