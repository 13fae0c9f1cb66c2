"""The two lanes stay honest: ``-m "not torchrun"`` holds no test that needs a training job."""

from __future__ import annotations

import pytest

from devtools.procs import torchrun_command
from devtools.training import train_command
from tests.conftest import TORCHRUN_FIXTURES


def test_every_test_using_a_torchrun_fixture_is_marked(request: pytest.FixtureRequest) -> None:
    items = request.session.items  # this session's selection, after ``-m`` deselected
    unmarked = [
        item.nodeid
        for item in items
        if TORCHRUN_FIXTURES.intersection(getattr(item, "fixturenames", ())) and not item.get_closest_marker("torchrun")
    ]
    assert unmarked == []
    if request.config.getoption("markexpr") == "not torchrun":
        assert [item.nodeid for item in items if item.get_closest_marker("torchrun")] == []


def test_an_unmarked_test_cannot_start_training() -> None:
    with pytest.raises(RuntimeError, match=r"test_lanes\.py::test_an_unmarked.* is not marked torchrun"):
        train_command(["--steps=1"])
    with pytest.raises(RuntimeError, match="is not marked torchrun"):
        train_command(["--steps=1"], nproc=2, entry="lerobot-train")
    with pytest.raises(RuntimeError, match="is not marked torchrun"):
        torchrun_command("writer.py", [], nproc=4)


@pytest.mark.torchrun
def test_a_marked_test_can() -> None:
    cmd = train_command(["--steps=1"], nproc=2)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert cmd[5].endswith("ckpt-train") and cmd[6:] == ["--steps=1"]
