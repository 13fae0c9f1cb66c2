"""The package's import graph, read from the source (module-level and function-level imports alike).

Layers, bottom first: what a module may import is its own layer or a lower one. ``format/`` is
the vocabulary of the layout and its rules, so it sits under the readers (``dcp/``, ``st/``) and
everything else; ``facts/`` reads for the rules what a step's files say, through the readers, so it
sits right above them. An import the other way is an *upward* import. A cycle is a set of modules that
import each other, whether or not a function-level import hides it at run time.

    python3 -m devtools.import_graph        # counts, cycles and upward imports
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = "ckpt_tools"
# Lower index = lower layer. Modules of the root not listed here are commands (top).
LAYERS: list[tuple[str, ...]] = [
    ("errors", "units", "io"),
    ("format",),
    ("st", "dcp"),
    ("facts",),
    ("check", "resume", "retention"),
    ("convert", "inspect"),
    ("hub",),  # the Hub as a source (hf:// paths) and a destination (push; convert-then-publish)
    ("cli", "train"),
]


def layer_of(module: str) -> int:
    """The layer of ``ckpt_tools.<first>...``; unknown first components are the top layer."""
    parts = module.split(".")
    first = parts[1] if len(parts) > 1 else ""
    for index, names in enumerate(LAYERS):
        if first in names:
            return index
    return len(LAYERS)


def module_name(root: Path, path: Path) -> str:
    relative = path.relative_to(root.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(root: Path, path: Path, known: set[str]) -> set[str]:
    """Project modules ``path`` imports (``from a import b`` counts ``a.b`` when that is a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(root, path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith(PACKAGE) and name != here:
                out.add(name)
    return out


def graph(root: Path) -> dict[str, set[str]]:
    files = {module_name(root, p): p for p in root.rglob("*.py")}
    known = set(files)
    return {name: imports_of(root, path, known) - {PACKAGE} for name, path in files.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in edges:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in edges.items() for b in targets if layer_of(b) > layer_of(a))


def main() -> int:
    root = Path(__file__).resolve().parent.parent / PACKAGE
    edges = graph(root)
    loops = cycles(edges)
    up = upward(edges)
    by_folder: dict[str, int] = defaultdict(int)
    for a, _ in up:
        by_folder[a.split(".")[1]] += 1
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} project imports")
    print(f"cycles: {len(loops)}")
    for loop in loops:
        print("  " + " <-> ".join(loop))
    print(f"upward imports: {len(up)}")
    for a, b in up:
        print(f"  {a} -> {b}")
    root_modules = [p for p in root.glob("*.py")]
    print(f"root modules: {len(root_modules)}, {sum(len(p.read_text().splitlines()) for p in root_modules)} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
