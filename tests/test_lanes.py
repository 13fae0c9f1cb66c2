"""The two lanes stay honest: ``-m "not torchrun"`` holds no test that starts a training job."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools import procs, training
from devtools.training import train
from tests.support.lanes import launches, starts_jobs


def _trains() -> object:  # never called: what the scan looks for
    return train("--steps=1")


def _trains_through_a_helper() -> object:
    return _trains()


def _converts(path: Path) -> object:
    from ckpt_tools.convert import convert_dcp

    return convert_dcp(path)


def test_the_scan_finds_launches_directly_and_through_helpers() -> None:
    assert launches(_trains) and launches(_trains_through_a_helper)
    assert not launches(_converts) and not launches(test_an_unmarked_test_cannot_start_training)


def test_every_test_that_starts_jobs_is_marked(request: pytest.FixtureRequest) -> None:
    items = request.session.items  # this session's selection, after ``-m`` deselected
    assert [item.nodeid for item in items if starts_jobs(item) and not item.get_closest_marker("torchrun")] == []
    if request.config.getoption("markexpr") == "not torchrun":
        assert [item.nodeid for item in items if item.get_closest_marker("torchrun")] == []


def test_an_unmarked_test_cannot_start_training() -> None:
    # Through module attributes, which the scan does not follow: the run-time refusal still holds.
    with pytest.raises(RuntimeError, match=r"test_lanes\.py::test_an_unmarked.* is not marked torchrun"):
        training.train_command(["--steps=1"])
    with pytest.raises(RuntimeError, match="is not marked torchrun"):
        training.train_command(["--steps=1"], nproc=2)
    with pytest.raises(RuntimeError, match="is not marked torchrun"):
        procs.torchrun_command("writer.py", [], nproc=4)


@pytest.mark.torchrun
def test_a_marked_test_can() -> None:
    cmd = training.train_command(["--steps=1"], nproc=2)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert cmd[5].endswith("ckpt-train") and cmd[6:] == ["--steps=1"]
