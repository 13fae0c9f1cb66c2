"""The package's import graph (read from the source, function-level imports included): no cycle, and
``format/`` - the rules, judging parsed data - imports nothing above ``errors``, ``units`` and ``io``.

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


def test_format_imports_only_the_layers_below_the_readers() -> None:
    """``format/``'s rules take parsed data: what a step's files say is read by ``facts/``, above the readers."""
    edges = graph(Path(ckpt_tools.__file__).parent)
    allowed = ("errors", "units", "io", "format")
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        if module.startswith("ckpt_tools.format")
        for target in targets
        if target.split(".")[1] not in allowed
    )
    assert any(m.startswith("ckpt_tools.format.rules.") for m in edges)  # the rules were read
    assert upward == []


def test_an_upward_import_from_format_is_found(tmp_path: Path) -> None:
    package = tmp_path / "ckpt_tools"
    (package / "format").mkdir(parents=True)
    (package / "st").mkdir()
    for init in (package, package / "format", package / "st"):
        (init / "__init__.py").write_text("")
    (package / "st" / "header.py").write_text("")
    (package / "format" / "rule.py").write_text("def f():\n    from ckpt_tools.st.header import read_header\n")
    assert graph(package)["ckpt_tools.format.rule"] == {"ckpt_tools.st.header"}
