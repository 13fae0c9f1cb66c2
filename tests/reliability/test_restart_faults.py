"""Faults survived by the job itself under ``torchrun --max-restarts=1`` with ``--resume=auto``, on one node.

Each test runs one job of the short reference run of a layout, injects one fault and asserts
the harness found nothing wrong (:mod:`devtools.reliability.restart_faults`): the job finished
with exit 0, resumed once from the ``last`` the fault left, every visible checkpoint is sound,
and its final weights, optimizer, scheduler and generators are bit-identical to the
uninterrupted run of the same flags (the session fixture ``runs``). The same faults across two
nodes (a killed worker, a kill mid-save, a killed node) are in ``tests/train/test_train_multinode.py``;
``bin/bench-recovery`` runs the whole matrix of faults × layouts × save modes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.reliability import restart_faults as R
from devtools.training import step_dir
from tests.support.restart_checks import survived

pytestmark = pytest.mark.torchrun


def test_a_worker_killed_mid_save_loses_nothing(runs: dict[str, Path], tmp_path: Path) -> None:
    """Killed the moment the second save became visible: the save never lands, ``last`` stays at 4."""
    trial = R.restart_trial(tmp_path / "run", "fsdp", "save-kill", step_dir(runs["fsdp"], 8), save_kill_delay_s=0)
    survived(trial)
    assert trial.landed == "mid-save" and trial.resumed_from == [4] and trial.redone_steps == 4
    # Measured from the relaunched workers' own log: the recovery, phase by phase.
    assert {"detection", "restart", "imports", "process_group", "build", "load", "total"} <= set(trial.phases_s)


def test_a_worker_stalled_past_the_collective_timeout_is_restarted(runs: dict[str, Path], tmp_path: Path) -> None:
    trial = R.restart_trial(tmp_path / "run", "ddp", "stall", step_dir(runs["ddp"], 8), seed=5)
    survived(trial)
    # The others noticed at their collective timeout, not before and not never.
    assert R.COLLECTIVE_TIMEOUT_S <= trial.phases_s["detection"] < R.COLLECTIVE_TIMEOUT_S + 30, trial.phases_s
