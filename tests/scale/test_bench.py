"""The benchmark's own parts, without a checkpoint: measuring a child, skipping what does not fit, the tables."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from devtools.scale import bench
from devtools.scale.bench import Options, Size, SizeResult, measure_size
from devtools.scale.measure import Measured, Sample, run_once
from devtools.scale.report import growth_table, size_table
from devtools.scale.world import World


def test_a_child_is_measured_on_its_own() -> None:
    sample = run_once([sys.executable, "-c", "x = bytearray(200 * 2**20); sum(range(10**6))"], timeout=60)
    assert sample.code == 0 and sample.cpu > 0 and sample.peak_mib > 200


def test_a_child_that_outlives_its_timeout_is_killed_and_reported() -> None:
    started = time.perf_counter()
    sample = run_once([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
    assert sample.timed_out and time.perf_counter() - started < 10


def test_sizes_the_machine_cannot_hold_are_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "_available_memory", lambda: 2**30)
    monkeypatch.setattr(bench, "disk_needed", lambda shape, world: 0)
    result = measure_size(Size("70b", "fsdp", 1024), tmp_path, Options(log=lambda _: None), keep=True)
    assert result.skipped is not None and result.skipped.startswith("memory: reading 2,")
    assert "skipped: memory" in size_table(result) and not any(tmp_path.iterdir())


def _result(ranks: int, chunks: int, torch_cpu: float, inspect_cpu: float) -> SizeResult:
    def m(cpu: float) -> Measured:
        return Measured((Sample(cpu, cpu, 50.0, 0),))

    result = SizeResult(Size("7b", "fsdp", ranks), World(1, ranks), chunks=chunks, torch=m(torch_cpu))
    result.tools = {("inspect", "foreign"): m(inspect_cpu), ("inspect", "warm"): "n/a: no cache"}
    result.labels = {"inspect": "inspect"}
    return result


def test_tables() -> None:
    small, large = _result(8, 1000, 2.0, 1.0), _result(64, 8000, 8.0, 8.0)
    table = size_table(small)
    assert "| inspect | foreign | 1.00 | 1.00 | 50 | 0.50 |" in table
    assert "| every tool | warm | n/a: no cache | | | |" in table
    growth = growth_table([large, small])
    assert "| torch read_metadata | - | 7b fsdp | 8 → 64 | 8.0 | 4.0 | 0.67 |" in growth
    assert "| inspect | foreign | 7b fsdp | 8 → 64 | 8.0 | 8.0 | 1.00 |" in growth
