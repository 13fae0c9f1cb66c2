"""What the main rank tells the user: progress bar, step lines, metrics.jsonl, tracker."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpt_tools.cli.untrusted import echo, printable
from ckpt_tools.train.config import TrainConfig
from ckpt_tools.train.parallel.distributed import DistEnv
from ckpt_tools.train.report import startup
from ckpt_tools.train.report.metrics import MetricsLog
from ckpt_tools.train.report.procstats import seconds_since_process_start

if TYPE_CHECKING:
    from ckpt_tools.train.checkpoint.manager import SaveStats, StagingWait
    from ckpt_tools.train.checkpoint.training_state import TrainingState


class Reporter:
    def __init__(self, cfg: TrainConfig, env: DistEnv, start_step: int, tracker: Any) -> None:
        self.env = env
        self.tracker = tracker
        self.log = MetricsLog(Path(str(cfg.output_dir)) / "metrics.jsonl") if env.is_main else None
        self.progress = None
        if env.is_main and cfg.progress_bar:
            from tqdm import tqdm

            self.progress = tqdm(
                total=cfg.steps,
                initial=start_step,
                desc="train",
                unit="step",
                file=sys.stderr,
                dynamic_ncols=True,
                disable=None,
            )

    def say(self, message: str) -> None:
        if not self.env.is_main:
            return
        if self.progress is not None:
            self.progress.write(printable(message))  # paths from the config: escaped
        else:
            echo(message)

    def tick(self) -> None:
        if self.progress is not None:
            self.progress.update(1)

    def first_step(self, step: int) -> None:
        """How long this process took from its start to its first finished step (resume cost), by phase."""
        seconds = seconds_since_process_start()
        if seconds is not None:
            self._event(
                {
                    "event": "first_step",
                    "step": step,
                    "seconds_since_process_start": round(seconds, 3),
                    "started_unix": startup.started_unix(),
                    "phases_s": startup.marks(),
                }
            )

    def step(self, step: int, reduced: dict[str, float], state: TrainingState) -> None:
        self.tick()
        record = {
            "step": step,
            **reduced,
            "lr": state.scheduler.get_last_lr()[0],
            "epoch": state.sampler.position().epoch,
            "samples_seen": state.sampler.samples_seen,
        }
        if self.log is not None:
            self.log.write(record)
            self.say(
                f"step {step}: loss {reduced['loss']:.4f}, {reduced['samples_per_s']:.0f} samples/s, lr {record['lr']:.2e}"
            )
        if self.tracker is not None:
            self.tracker.log(record)

    def _event(self, record: dict[str, Any]) -> None:
        """One line of metrics.jsonl (main rank only: others have no log)."""
        if self.log is not None:
            self.log.write(record)

    def skipped(self, step: int, reason: str, line: str) -> None:
        """An optimizer update skipped for a non-finite loss or gradient (--max_nonfinite_steps)."""
        self._event({"event": "skipped_update", "step": step, "reason": reason})
        self.say(line)

    def checkpoint(self, stats: SaveStats) -> None:
        self._event(
            {
                "event": "checkpoint",
                "step": stats.step,
                "pause_s": round(stats.pause_s, 4),
                "async": stats.asynchronous,
                "extra_peak_bytes": stats.extra_bytes,
                "phases_s": stats.phases,
            }
        )
        how = "staged; writing in the background" if stats.asynchronous else "saved"
        self.say(f"checkpoint {stats.path} {how} (loop paused {stats.pause_s:.2f} s)")

    def staging(self, wait: StagingWait) -> None:
        """The loop's wait for a background save's host copy (the rest of that save's pause)."""
        self._event(
            {
                "event": "checkpoint_staged",
                "step": wait.step,
                "wait_s": round(wait.wait_s, 4),
                "stage_s": round(wait.stage_s, 4),
            }
        )

    def committed(self, path: Path, seconds: float, phases: dict[str, float]) -> None:
        """A background save finished (called from its thread)."""
        self._event(
            {"event": "checkpoint_committed", "path": str(path), "write_s": round(seconds, 4), "phases_s": phases}
        )
        self.say(f"checkpoint {path} committed ({seconds:.2f} s in the background)")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
