"""A slice of the differential campaign (``bin/differential-report``): the tools' verdicts against reality.

A few mutation families on one small checkpoint each: the trainer's own 1-process safetensors
run and LeRobot's FSDP2 DCP fixture (inspect against the reference readers only: LeRobot's
resume is not installed here); the sharded layouts are the full campaign's (its bench script). Every case runs ``inspect``,
``verify-resume``, the reference readers and the real ``ckpt-train --resume=true``; the test
asserts that no verdict disagreed with what happened. Nothing is expected in advance - a
``verify-resume`` that always said "resumable" fails here, because the resumes it would wave
through are refused or end elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.differential.bases import build_trainer_base, lerobot_base
from devtools.differential.runner import Campaign, CaseResult

SEED = 2026
# A family whose verdicts the trainer's real resume decides; the others are the full campaign's.
SINGLE_FAMILIES = ["config_unbuildable"]


def run_slice(work: Path, base_name: str, families: list[str], sibling: bool) -> list[CaseResult]:
    base = build_trainer_base(base_name, work / "bases", sibling=sibling)
    campaign = Campaign(work, {base_name: base})
    return [campaign.run(spec) for spec in campaign.plan(SEED, len(families), families, campaign.bases)]


def explain(results: list[CaseResult]) -> str:
    return "\n".join(
        f"{r.detail}: {r.disagreements} verify={r.verify.get('failed') or r.verify.get('rc')} "
        f"resume={r.resume.get('outcome')} {r.resume.get('line')} {r.resume.get('differences', '')}"
        for r in results
        if r.disagreements
    )


@pytest.mark.torchrun
def test_verdicts_match_reality_on_one_process(tmp_path: Path) -> None:
    results = run_slice(tmp_path, "single", SINGLE_FAMILIES, sibling=False)
    assert [r.spec.family for r in results] == SINGLE_FAMILIES
    assert all(r.resume.get("outcome") != "not-run" for r in results)
    assert not any(r.disagreements for r in results), explain(results)


def test_inspect_matches_the_readers_on_a_lerobot_checkpoint(tmp_path: Path) -> None:
    base = lerobot_base("lerobot_main_fsdp_dcp")
    campaign = Campaign(tmp_path, {base.name: base})
    families = ["safetensors_header", "truncate", "byte_flip", "value_edit"]
    results = [campaign.run(spec) for spec in campaign.plan(SEED, len(families), families, campaign.bases)]
    # The slice must hold damage the reference readers refuse, or an inspect that always said
    # "healthy" would pass it.
    assert any(v != "ok" for r in results for v in r.reference.values()), [r.detail for r in results]
    assert not any(r.disagreements for r in results), explain(results)
