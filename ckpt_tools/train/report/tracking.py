"""Experiment tracking with trackio (the ``tracking`` extra), from the main rank only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckpt_tools.errors import ConfigError
from ckpt_tools.train.config import TrainConfig


@dataclass
class TrackioTracker:
    run: Any
    module: Any

    @classmethod
    def start(cls, cfg: TrainConfig) -> TrackioTracker:
        try:
            import trackio
        except ImportError:
            raise ConfigError("--trackio.enable=true needs trackio: pip install 'ckpt-tools[tracking]'") from None
        from ckpt_tools.train.config import train_config_dict

        project = cfg.trackio.project or cfg.job_name or "ckpt-tools"
        # Local logging only: no background system-metrics threads in a training process.
        run = trackio.init(
            project=project, name=cfg.job_name, config=train_config_dict(cfg), auto_log_cpu=False, auto_log_gpu=False
        )
        return cls(run, trackio)

    def log(self, record: dict[str, Any]) -> None:
        """Log the reduced metrics of one step (``step`` is trackio's own axis, not a metric)."""
        metrics = {k: v for k, v in record.items() if k != "step"}
        self.module.log(metrics, step=int(record["step"]))

    def finish(self) -> None:
        self.module.finish()
