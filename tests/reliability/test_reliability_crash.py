"""Crash consistency under real faults, the CI slice (docs/reliability.md); ``bin/reliability-report`` runs the full counts.

Each test drives real ``torchrun`` jobs through :mod:`devtools.reliability.crash_harness` and asserts
the harness found nothing wrong: after every fault ``last`` is complete (``verify-resume`` and
``inspect`` pass on every visible step), the job exited by itself, and the next launch resumed
from ``last`` and trained on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.reliability import crash_harness as H

pytestmark = pytest.mark.torchrun


def _clean(trials: list[H.Trial]) -> None:
    for t in trials:
        assert not t.violations, f"{t.kind} {t.config} async={t.asynchronous} seed={t.seed} #{t.index}: {t.violations}"


def test_sigkill_at_random_moments_of_saves_never_breaks_last(tmp_path: Path) -> None:
    # The CI slice kills an async DCP chain: the synchronous mid-save SIGKILL is proven
    # deterministically by tests/reliability/test_train_crash.py, and bin/reliability-report
    # runs random kills over every layout and format.
    chain = H.Chain(tmp_path / "run", "fsdp-dcp", True, 12)
    trials = list(H.kill_trials(chain, 1))  # bin/reliability-report chains many kills
    H.finish_chain(chain)
    assert len(trials) == 1 and all(t.injected for t in trials), [t.landed for t in trials]
    _clean(chain.trials)
    assert all(t.resumed for t in chain.trials)  # each kill's last was resumed, the final one to completion
    assert all(t.exit_code != 0 for t in trials)


def test_sigterm_during_an_async_save_finishes_it_and_stops_cleanly(tmp_path: Path) -> None:
    chain = H.Chain(tmp_path / "run", "fsdp-safetensors_dcp", True, 21)
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


def test_a_stalled_rank_ends_the_job_at_the_collective_timeout(tmp_path: Path) -> None:
    trial = H.rank_death_trial(tmp_path / "run", "fsdp-dcp", 51, resume=False, stall=True, collective_timeout_s=10)
    _clean([trial])
    assert trial.exit_code not in (None, 0) and not trial.hung
    assert any("a collective failed" in line for line in trial.error_lines), trial.error_lines
