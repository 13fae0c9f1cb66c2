"""Metrics reduced across ranks: mean loss over every worker, cluster-wide samples/s."""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ckpt_tools.train.parallel.distributed import DistEnv


@dataclass
class MetricsWindow:
    env: DistEnv
    samples_per_step: int  # batch_size × dp_world_size: what one loop step consumes cluster-wide
    loss_sum: float = 0.0
    loss_steps: int = 0  # steps with a finite loss: a skipped step's NaN does not make the mean NaN
    steps: int = 0
    grad_norm: float | None = None
    started: float = field(default_factory=time.perf_counter)

    def add(self, loss: float) -> None:
        if math.isfinite(loss):
            self.loss_sum += loss
            self.loss_steps += 1
        self.steps += 1

    def reduce(self) -> dict[str, float]:
        """Collective: the window's mean (finite) loss over all ranks and the cluster throughput."""
        loss = torch.tensor([self.loss_sum, float(self.loss_steps)], dtype=torch.float64)
        if self.env.distributed:
            device_loss = loss.to(self.env.device)
            dist.all_reduce(device_loss)
            loss = device_loss.cpu()
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        out = {
            "loss": float(loss[0] / loss[1]) if loss[1] else float("nan"),
            "samples_per_s": self.samples_per_step * self.steps / elapsed,
        }
        if self.grad_norm is not None:
            out["grad_norm"] = self.grad_norm
        self.loss_sum, self.loss_steps, self.steps, self.started = 0.0, 0, 0, time.perf_counter()
        return out


class MetricsLog:
    """``metrics.jsonl`` in the output dir (main rank): one JSON object per logged step.

    Events that are not training steps (a checkpoint's loop pause, a background save's
    commit, the time to the first step) carry an ``event`` key. Background saves write from
    their own thread, hence the lock.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
