"""The retention rule, alone: which steps go and why each other stays (pure, no files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_tools.format.rules.retention import IN_USE, LAST, NEWEST_RESUMABLE, retention_plan


def reasons(plan, step: int) -> tuple[str, ...]:
    return next(f.reasons for f in plan.fates if f.step == step)


def test_keeps_the_newest_k_and_removes_the_rest_oldest_first() -> None:
    plan = retention_plan([4, 1, 3, 2, 5], 2, last=5, newest_resumable=5)
    assert plan.removed == [1, 2, 3]
    assert [f.step for f in plan.kept] == [4, 5]
    assert reasons(plan, 5) == (LAST, NEWEST_RESUMABLE, "within the newest 2")
    assert reasons(plan, 4) == ("within the newest 2",)


def test_never_removes_last_even_when_it_is_older_than_the_newest_k() -> None:
    # A resume from step 2 into a dir holding 3..5 (--overwrite_checkpoints), before its first save.
    plan = retention_plan([1, 2, 3, 4, 5], 1, last=2, newest_resumable=5)
    assert plan.removed == [1, 3, 4]
    assert reasons(plan, 2) == (LAST,)


def test_keeps_the_newest_resumable_step_when_last_lags_behind() -> None:
    # A save stopped between renaming 000006 into place and moving `last`; 000007 is damaged.
    plan = retention_plan([4, 5, 6, 7], 1, last=5, newest_resumable=6)
    assert plan.removed == [4]
    assert reasons(plan, 6) == (NEWEST_RESUMABLE,)
    assert reasons(plan, 7) == ("within the newest 1",)


def test_keeps_a_step_in_use() -> None:
    plan = retention_plan([1, 2, 3], 1, last=3, newest_resumable=3, in_use={1})
    assert plan.removed == [2]
    assert reasons(plan, 1) == (IN_USE,)


def test_without_a_usable_last_nothing_is_removed() -> None:
    plan = retention_plan([1, 2, 3], 1, last=None, newest_resumable=3)
    assert plan.removed == []
    assert all("no usable last" in f.reasons for f in plan.fates)


def test_fewer_steps_than_k_removes_nothing_and_duplicates_count_once() -> None:
    plan = retention_plan([2, 2, 1], 3, last=2, newest_resumable=2)
    assert plan.removed == []
    assert [f.step for f in plan.fates] == [1, 2]


def test_k_below_one_is_a_bug_of_the_caller() -> None:
    with pytest.raises(ValueError):
        retention_plan([1], 0, last=1, newest_resumable=1)


def test_the_start_up_rules_refuse_a_bad_keep_last_n_or_last_link_in_one_line() -> None:
    from ckpt_tools.format.rules.startup import RunSettings, setting_refusals
    from ckpt_tools.format.train_config import SavedConfig

    found = [r.message for r in setting_refusals(RunSettings(keep_last_n=0, last_link="hardlink"))]
    assert found == [
        "--checkpoint.keep_last_n=0: must be ≥ 1 (the number of newest checkpoints kept; unset keeps all)",
        "--checkpoint.last_link=hardlink: choose auto or file",
    ]
    assert setting_refusals(RunSettings(keep_last_n=1, last_link="file")) == []
    # The tools read the same fields from a saved train_config.json and apply the same rules.
    saved = SavedConfig(Path("train_config.json"), {"checkpoint": {"keep_last_n": -1, "last_link": "auto"}})
    assert saved.keep_last_n == -1
    refusals = [r.message for r in setting_refusals(saved.run_settings())]
    assert len(refusals) == 1 and refusals[0].startswith("--checkpoint.keep_last_n=-1")
