"""The package's import graph (read from the source, function-level imports included): no cycle, and
``format/`` - the rules, judging parsed data - imports nothing above ``errors``, ``units`` and ``io``.

A cycle hidden by a function-level import still couples the modules in it: neither can be
understood, tested or moved without the other. ``python3 -m devtools.import_graph`` prints the
graph's figures (cycles, imports from a lower layer to a higher one).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ckpt_tools
from devtools.import_graph import cycles, graph, upward


@pytest.fixture(scope="module")
def package_edges() -> dict[str, set[str]]:
    """The package's graph, read once for the tests of this file."""
    return graph(Path(ckpt_tools.__file__).parent)


def test_no_import_cycles(package_edges: dict[str, set[str]]) -> None:
    assert len(package_edges) > 100  # the whole package was read
    assert cycles(package_edges) == []


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


FORMAT_MAY_IMPORT = ("errors", "units", "io", "format")


def format_upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """``module -> target`` for every import from ``format/`` of a module outside :data:`FORMAT_MAY_IMPORT`."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        if module.split(".")[1:2] == ["format"]
        for target in targets
        if target.split(".")[1] not in FORMAT_MAY_IMPORT
    )


def test_format_imports_nothing_above_errors_units_io(package_edges: dict[str, set[str]]) -> None:
    """``format/``'s rules take parsed data: what a step's files say is read by ``facts/``, above the readers."""
    assert "ckpt_tools.format.rules.consistency" in package_edges and "ckpt_tools.facts.consistency" in package_edges
    assert format_upward_imports(package_edges) == []


def test_a_function_level_import_of_a_reader_from_format_is_found(tmp_path: Path) -> None:
    package = tmp_path / "ckpt_tools"
    for sub in ("format", "st", "io"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "st" / "header.py").write_text("")
    (package / "io" / "safe_read.py").write_text("")
    (package / "format" / "rule.py").write_text(
        "from ckpt_tools.io.safe_read import x\n\n\ndef f():\n    from ckpt_tools.st.header import read_header\n"
    )
    assert format_upward_imports(graph(package)) == ["ckpt_tools.format.rule -> ckpt_tools.st.header"]


# The one import from a lower layer to a higher one, on purpose: verify-resume runs the trainer's
# own pre-flight (its config parser, the policy built on the meta device, the load plan) where
# torch is installed, so its verdict is the launch's; a copy of those rules would drift.
DELIBERATE_UPWARD = {
    ("ckpt_tools.resume.checks.state", "ckpt_tools.train.parsing"),
    ("ckpt_tools.resume.checks.state", "ckpt_tools.train.preflight"),
}


def test_every_other_import_goes_down_the_layers(package_edges: dict[str, set[str]]) -> None:
    assert set(upward(package_edges)) == DELIBERATE_UPWARD
