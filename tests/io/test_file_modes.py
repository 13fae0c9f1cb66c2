"""Every file the project writes gets the mode ``open()`` would give it: ``0o666 & ~umask``, like torch's DCP shards.

The atomic writers create their temporary siblings with ``mkstemp`` (always 0600); the
configs, processors, RNG and scheduler state and every converted file must not stay private
when the user's umask says otherwise (nor become readable when it says 077).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from ckpt_tools.convert import convert_dcp
from ckpt_tools.io.fsutil import current_umask, write_json_atomic
from ckpt_tools.train.safetensors_io import save_state_dict
from devtools.training import step_dir


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_follow_the_umask(runs: dict[str, Path], tmp_path: Path, umask: int, mode: int) -> None:
    step = tmp_path / "checkpoints" / "000008"
    shutil.copytree(step_dir(runs["fsdp"], 8), step)
    out = tmp_path / "converted"
    previous = os.umask(umask)
    try:
        assert current_umask() == umask
        write_json_atomic(tmp_path / "scheduler_state.json", {"last_epoch": 8})  # configs, scheduler, processors
        save_state_dict({"rng": torch.zeros(4, dtype=torch.uint8)}, tmp_path / "rng_state.safetensors")
        result = convert_dcp(step, output=out, max_shard_size="100KB", progress=False)
    finally:
        os.umask(previous)
    written = [tmp_path / "scheduler_state.json", tmp_path / "rng_state.safetensors", *result.output_files]
    assert any(p.name.endswith(".index.json") for p in result.output_files) and len(result.output_files) > 2
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in written} == {p.name: oct(mode) for p in written}
