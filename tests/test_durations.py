"""The measured file lengths the suite's order comes from (devtools/test_durations.py)."""

from __future__ import annotations

from pathlib import Path

from devtools import test_durations
from devtools.procs import REPO


def test_every_recorded_file_is_a_test_file_of_this_checkout() -> None:
    recorded = test_durations.load()
    assert recorded, "tests/durations.json is missing or empty"
    assert [name for name in recorded if not (REPO / name).is_file()] == []


def test_a_junit_report_sums_each_files_tests(tmp_path: Path) -> None:
    report = tmp_path / "suite.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.train.test_a" name="test_x" time="1.5"/>'
        '<testcase classname="tests.train.test_a" name="test_y" time="2.0"/>'
        '<testcase classname="tests.test_b.TestGroup" name="test_z" time="0.25"/>'
        "</testsuite></testsuites>"
    )
    assert test_durations.file_seconds(report) == {"tests/train/test_a.py": 3.5, "tests/test_b.py": 0.25}
