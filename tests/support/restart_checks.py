"""The verdict every fault test under torchrun's restarts shares (one node or several)."""

from __future__ import annotations

from devtools.reliability.restart_faults import RestartTrial


def survived(trial: RestartTrial) -> None:
    """The job finished by itself, nothing was corrupted, and the harness found nothing wrong."""
    assert not trial.violations, f"{trial.fault} {trial.layout} async={trial.asynchronous}: {trial.violations}"
    assert trial.exit_code == 0 and not trial.hung and not trial.corrupted
