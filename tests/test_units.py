"""The one spelling of byte sizes and counts that every command and the model card show."""

from __future__ import annotations

from ckpt_tools.units import human_bytes, human_count


def test_bytes_are_exact_below_a_kib_then_binary_units() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(10_800) == "10.5 KiB"
    assert human_bytes(150 * 2**20) == "150 MiB"  # no decimals from 100 on
    assert human_bytes(3 * 2**30 + 2**29) == "3.5 GiB"
    assert human_bytes(2**60) == "1024 PiB"  # the largest unit keeps growing


def test_counts_are_exact_below_a_thousand() -> None:
    assert human_count(999) == "999"
    assert human_count(1_500) == "1.5K"
    assert human_count(2_520_000) == "2.52M"
    assert human_count(7_000_000_000) == "7.00B"
