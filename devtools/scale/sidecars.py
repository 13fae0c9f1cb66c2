"""Every file of a step besides the DCP shards, through the writers the trainer uses for them.

The trainer's step holds the policy config, ``train_config.json`` and the normalizer
processors in ``pretrained_model/``; the RNG states of every rank, the LR scheduler state and,
last, ``training_step.json`` in ``training_state/`` (docs/checkpoint-format.md). Each is
written here by the same function the trainer's save calls (``write_json_atomic``,
``Pipeline.save``, ``save_rng_states``, ``training_step_json``), from values of the generated
run: the world's size and mesh, the step, the schedule. Each rank's generator state starts
from ``seed + 1 + rank``, as the trainer starts it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ckpt_tools.format import layout
from ckpt_tools.format.record import SAVE_ID_KEY, TrainingStep, training_step_json
from ckpt_tools.io.fsutil import write_json_atomic
from devtools.scale.shapes import LlamaShape


def write_pretrained_model(
    directory: Path, shape: LlamaShape, train_config: dict[str, Any], dataset_root: Path
) -> None:
    from ckpt_tools.train.data.dataset import load_dataset
    from ckpt_tools.train.data.processors import make_processors

    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(directory / layout.POLICY_CONFIG, shape.policy_config())
    write_json_atomic(directory / layout.TRAIN_CONFIG, train_config)
    for pipeline in make_processors(load_dataset(dataset_root, chunk_size=1).stats):
        pipeline.save(directory)


def write_training_state(
    directory: Path, record: TrainingStep, scheduler: dict[str, Any], seed: int, save_id: str | None = None
) -> None:
    """The sidecars of ``training_state/``; ``training_step.json`` last, as the trainer writes it
    (stamped with ``save_id`` as the trainer stamps its JSON records)."""
    from ckpt_tools.train.checkpoint import rng

    assert record.topology is not None
    world = record.topology.world_size
    directory.mkdir(parents=True, exist_ok=True)
    states = rng.lerobot_rng_state()
    for r in range(world):
        states[f"rank{r}.torch"] = torch.Generator().manual_seed(seed + 1 + r).get_state()
    rng.save_rng_states(states, directory / layout.RNG_STATE, world)
    stamp = {SAVE_ID_KEY: save_id} if save_id is not None else {}
    write_json_atomic(directory / layout.SCHEDULER_STATE, {**scheduler, **stamp})
    (directory / layout.TRAINING_STEP).write_text(training_step_json(record, save_id))
