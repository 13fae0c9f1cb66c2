"""Where LeRobot's sampler resumes: derived from the step, since LeRobot records no sampler position.

``ckpt-train`` saves the data position (``samples_seen`` and the sampler's epoch and offset) in
``training_step.json``. LeRobot saves only ``step``, the per-process ``batch_size`` and the
data-parallel world size, and derives the position on resume from them. Its rule, from its
source:

- LeRobot main, ``src/lerobot/common/train_utils.py`` ``save_training_metadata``: "``step``
  counts loop iterations (= micro-batches), so the sampler resume offset is ``step x batch_size
  x dp_world_size`` with no grad-accum factor"; the world size is ``dp_world_size`` (older
  records' ``num_processes``, as ``load_training_metadata`` reads them).
- LeRobot 0.6.1, ``lerobot/scripts/lerobot_train.py``: the same product with the recorded
  ``num_processes`` (0.6.1 had no gradient accumulation).
- Both, ``datasets/sampler.py`` ``compute_sampler_state(step, num_frames, batch_size,
  num_processes)``: the epoch and the index into the epoch's permutation. Under accelerate's
  batch sharding (``even_batches=True``) each rank takes ``ceil(ceil(num_frames / batch_size) /
  num_processes)`` batches per epoch, so an epoch is that many steps and the offset restarts at
  0 each epoch: ``epoch, k = divmod(step, batches_per_epoch)``, ``start_index = min(k ×
  batch_size × num_processes, num_frames)``.

``num_frames`` there is the sampler's length: the dataset's frames (``meta/info.json``
``total_frames``) when every episode is used and the policy drops no last frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def samples_seen(step: int, batch_size: int, dp_world_size: int) -> int:
    """Samples of the global stream a LeRobot run had consumed at ``step`` (no grad-accum factor)."""
    return step * batch_size * dp_world_size


@dataclass(frozen=True)
class LeRobotSamplerState:
    """``compute_sampler_state``'s result: the epoch, and the index into its permutation."""

    epoch: int
    start_index: int


def sampler_state(step: int, num_frames: int, batch_size: int, dp_world_size: int) -> LeRobotSamplerState | None:
    """Where LeRobot's ``EpisodeAwareSampler`` resumes (None: a size that is not positive)."""
    if num_frames <= 0 or batch_size <= 0 or dp_world_size <= 0:
        return None
    batches_per_epoch = math.ceil(math.ceil(num_frames / batch_size) / dp_world_size)
    epoch, into = divmod(step, batches_per_epoch)
    return LeRobotSamplerState(epoch, min(into * batch_size * dp_world_size, num_frames))
