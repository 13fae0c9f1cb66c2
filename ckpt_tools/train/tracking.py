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
        from ckpt_tools.train.checkpoint import train_config_dict

        project = cfg.trackio.project or cfg.job_name or "ckpt-tools"
        run = trackio.init(project=project, name=cfg.job_name, config=train_config_dict(cfg))
        return cls(run, trackio)

    def log(self, metrics: dict[str, Any]) -> None:
        self.module.log(metrics)

    def finish(self) -> None:
        self.module.finish()
