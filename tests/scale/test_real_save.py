"""The generator against the real thing: torch's own save, and the trainer's own step directory.

``dcp.save`` through the trainer's save path (:mod:`devtools.scale.real_save`, under torchrun)
and the generator must produce the same DCP directories - items, chunks, storage entries,
offsets and lengths, ``planner_data``, shard files and even the ``.metadata`` size - for
uneven and empty FSDP2 shards, HSDP's de-duplication and writer threads splitting a rank's
writes over several files. And a generated step must hold the files a real trainer step holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_tools.format import layout as L
from devtools.scale.cases import CASES
from devtools.scale.generate import Recipe, generate
from devtools.scale.run import TrainingRun
from devtools.scale.shapes import TINY
from devtools.scale.validate import differences_from_torch, real_checkpoints
from devtools.scale.world import World


@pytest.mark.torchrun
def test_generated_dcp_directories_are_what_torch_saves(tmp_path: Path) -> None:
    real = real_checkpoints(tmp_path / "real")  # "real" and "made": paths of one length (see validate)
    found = differences_from_torch(real, tmp_path / "made")
    assert len(found) == 2 * len(CASES)
    assert {case: lines for case, lines in found.items() if lines} == {}


def test_a_generated_step_holds_what_a_trainer_step_holds(runs: dict[str, Path], tmp_path: Path) -> None:
    trainer = (runs["hsdp"] / L.CHECKPOINTS_DIR / L.LAST_LINK).resolve()  # HSDP 2×2, dcp, one writer thread
    made = generate(tmp_path, Recipe(TINY, World(2, 2), threads=1, run=TrainingRun(step=8))).step_dir
    assert _files(made) == _files(trainer)
    for name in (L.TRAINING_STEP, L.SCHEDULER_STATE):
        assert _keys(_json(made / L.TRAINING_STATE_DIR / name)) == _keys(_json(trainer / L.TRAINING_STATE_DIR / name))
    ours, theirs = (
        _json(made / L.PRETRAINED_MODEL_DIR / L.TRAIN_CONFIG),
        _json(trainer / L.PRETRAINED_MODEL_DIR / L.TRAIN_CONFIG),
    )
    assert _keys({**ours, "policy": None}) == _keys({**theirs, "policy": None})  # a Llama is no ckpt-train policy


def _files(step: Path) -> list[str]:
    return sorted(str(p.relative_to(step)) for p in step.rglob("*"))


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _keys(value: object, prefix: str = "") -> list[str]:
    if not isinstance(value, dict):
        return [prefix]
    return [k for key, v in value.items() for k in _keys(v, f"{prefix}.{key}")]
