"""The staging gate of a background save: the loop may update the state only once it is copied.

``BackgroundSave`` copies the captured state in its own thread while the loop runs the next
forward and backward; ``wait_staged`` (called by ``CheckpointManager.before_update`` before
each optimizer update) must not return before the copy exists, also when the copy fails.
The job here is a recorder of what the thread did, so that the order is observable.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from ckpt_tools.errors import CheckpointError
from ckpt_tools.train.checkpoint.manager import BackgroundSave


class RecordingJob:
    """Stands in for a SaveJob: records when it is written."""

    step = 7

    def __init__(self, events: list[str], live: torch.Tensor) -> None:
        self.events, self.live, self.timings = events, live, {}
        self.copy: torch.Tensor | None = None

    def run(self, groups: Any) -> None:
        self.events.append("write")


def test_the_gate_opens_only_after_the_copy_and_the_write_follows() -> None:
    events: list[str] = []
    live = torch.arange(4.0)
    job = RecordingJob(events, live)
    release = threading.Event()

    def stage(captured: RecordingJob) -> RecordingJob:
        release.wait(5)  # a slow copy: the loop reaches its gate first
        captured.copy = captured.live.clone()
        events.append("stage")
        return captured

    save = BackgroundSave(job, None, lambda j, s: events.append("committed"), stage)  # type: ignore[arg-type]
    save.start()
    gate = threading.Thread(target=save.wait_staged)
    gate.start()
    gate.join(0.3)
    assert gate.is_alive() and events == []  # still waiting for the copy
    release.set()
    gate.join(5)
    assert not gate.is_alive() and events[0] == "stage"
    live.add_(1)  # the optimizer update, after the gate: the copy keeps the saved values
    save.join()
    assert events == ["stage", "write", "committed"]
    assert torch.equal(job.copy, torch.arange(4.0)) and job.timings["stage"] >= 0


def test_a_failed_copy_opens_the_gate_and_fails_the_save() -> None:
    events: list[str] = []

    def stage(captured: RecordingJob) -> RecordingJob:
        raise OSError(12, "Cannot allocate memory")

    save = BackgroundSave(RecordingJob(events, torch.zeros(1)), None, lambda j, s: None, stage)  # type: ignore[arg-type]
    started = time.perf_counter()
    save.start()
    save.wait_staged()  # returns: the loop must never hang on a failed copy
    assert time.perf_counter() - started < 5
    with pytest.raises(CheckpointError, match=r"background save of step 7 failed.*Cannot allocate memory"):
        save.join()
    assert events == []  # nothing was written or committed
