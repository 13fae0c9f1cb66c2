"""The live objects a checkpoint captures and a resume restores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ckpt_tools.train.config import TrainConfig
from ckpt_tools.train.data.processors import Pipeline
from ckpt_tools.train.data.sampler import GlobalOrderSampler
from ckpt_tools.train.ema import EmaShadow
from ckpt_tools.train.parallel.distributed import DistEnv
from ckpt_tools.train.parallel.precision import PrecisionPlan
from ckpt_tools.train.parallel.wrap import ParallelModel


@dataclass
class TrainingState:
    """Everything a checkpoint captures, as live objects."""

    cfg: TrainConfig
    env: DistEnv
    parallel: ParallelModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: Any
    sampler: GlobalOrderSampler
    precision: PrecisionPlan
    preprocessor: Pipeline
    postprocessor: Pipeline
    peft_model: Any = None  # the peft.PeftModel when the run trains an adapter
    ema: EmaShadow | None = None  # --ema.enable=true: the shadow of the weights
    step: int = 0
    optimizer_steps: int = 0
    # Where a run started from another run's checkpoint parts (--checkpoint.load_from), recorded in
    # every training_step.json of the run; None for a run started fresh.
    initialized_from: dict[str, Any] | None = None
