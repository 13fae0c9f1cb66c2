"""The package's import graph (read from the source, function-level imports included) has no cycle.

A cycle hidden by a function-level import still couples the modules in it: neither can be
understood, tested or moved without the other. ``python3 -m devtools.import_graph`` prints the
graph's figures (cycles, imports from a lower layer to a higher one).
"""

from __future__ import annotations

from pathlib import Path

import ckpt_tools
from devtools.import_graph import cycles, graph


def test_no_import_cycles() -> None:
    edges = graph(Path(ckpt_tools.__file__).parent)
    assert len(edges) > 100  # the whole package was read
    assert cycles(edges) == []


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
