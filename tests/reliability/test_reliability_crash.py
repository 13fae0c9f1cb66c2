"""Crash consistency under real faults, the CI slice (docs/reliability.md); ``bin/reliability-report`` runs the full counts.

Each test drives real ``torchrun`` jobs through :mod:`devtools.reliability.crash_harness` and asserts
the harness found nothing wrong: after every fault ``last`` is complete (``verify-resume`` and
``inspect`` pass on every visible step), the job exited by itself, and the next launch resumed
from ``last`` and trained on. SIGKILLs mid-save (sync and async) and a stalled rank are run
under torchrun's restarts in ``test_restart_faults.py``, where the job must also end
bit-identical to an uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.reliability import crash_harness as H
from devtools.training import TINY

pytestmark = pytest.mark.torchrun


def _clean(trials: list[H.Trial]) -> None:
    for t in trials:
        assert not t.violations, f"{t.kind} {t.config} async={t.asynchronous} seed={t.seed} #{t.index}: {t.violations}"


def test_sigterm_during_an_async_save_finishes_it_and_stops_cleanly(tmp_path: Path) -> None:
    chain = H.Chain(tmp_path / "run", "fsdp-safetensors_dcp", True, 21, model=list(TINY))
    (trial,) = H.kill_trials(chain, 1, "sigterm")
    H.finish_chain(chain)
    _clean(chain.trials)
    assert trial.injected and trial.resumed
    assert trial.last_after is not None and trial.last_after >= (trial.save_step or 0)  # the in-flight save landed


def test_a_full_disk_during_a_save_fails_with_one_line_and_keeps_last(tmp_path: Path) -> None:
    trial = H.full_disk_trial(tmp_path, "fsdp-safetensors_dcp", 31)
    _clean([trial])
    assert trial.exit_code not in (None, 0)
    assert trial.error_lines and all(any(word in line for word in H.DISK_FULL_WORDS) for line in trial.error_lines), (
        trial.error_lines
    )
    assert trial.last_after == trial.last_before and trial.resumed


def test_a_rank_killed_mid_training_ends_the_job(tmp_path: Path) -> None:
    trial = H.rank_death_trial(tmp_path / "run", "ddp", 41, resume=False)
    _clean([trial])
    assert trial.exit_code not in (None, 0) and not trial.hung
