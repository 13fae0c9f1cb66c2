"""Which part of a DCP state dict a conversion takes: a key path the user names, or the model found by shape.

A DCP checkpoint is one nested dict, flattened; producers nest it differently:

- accelerate (LeRobot, ckpt-train): ``{"model": ...}`` and ``{"optimizer": ...}``, one per directory;
- torchtitan's ``CheckpointManager``: the model's entries flattened to the top level, next to
  ``optimizer``, ``lr_scheduler``, ``dataloader`` and ``train_state``;
- PyTorch's DCP recipe: ``{"app": {"model": ..., "optim": ...}}``;
- ``dcp.save(model.state_dict())``: the weights alone, flat.

Weights are never taken together with training state: whatever is selected for the model leaves
out the states other trainers save next to it (by name, :data:`~ckpt_tools.format.layout.NON_MODEL_DCP_KEYS`)
and any subtree shaped like an optimizer's state dict (its ``param_groups``, nested as torch's
``Optimizer.state_dict`` or flattened to ``param_groups.<fqn>.<key>`` as torchtitan's). When the
model cannot be told apart, the conversion is refused, naming the candidates for ``--key``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.errors import CheckpointError, UsageError
from ckpt_tools.format import layout as L

KeyPath = tuple[str | int, ...]

_PARAM_GROUPS = "param_groups"


def dotted(path: Iterable[str | int]) -> str:
    """A nested-dict path as the user types it (``--key app.model``)."""
    return ".".join(str(p) for p in path)


@dataclass(frozen=True)
class Selection:
    """The subtree at ``prefix`` without the subtrees at ``left_out``; output names are paths below ``prefix``."""

    prefix: KeyPath
    what: str  # "model" or "optimizer": the output's form
    left_out: tuple[KeyPath, ...] = ()
    picked: str | None = None  # how it was found, when the user did not name it (a note)

    @property
    def label(self) -> str:
        if self.prefix:
            return f"'{dotted(self.prefix)}'"
        return "the top-level model entries" if self.left_out else "the top level"

    def contains(self, path: KeyPath) -> bool:
        n = len(self.prefix)
        if len(path) <= n or path[:n] != self.prefix:
            return False
        return not any(path[: len(out)] == out for out in self.left_out)

    def name(self, path: KeyPath) -> str:
        return dotted(path[len(self.prefix) :])


class _Tree:
    """The nested-dict shape of a DCP state dict, from the paths of its items (built once, walked cheaply)."""

    def __init__(self, index: ChunkIndex) -> None:
        self.tensors = {e.path for e in index.tensors.values() if e.path}
        self.leaves = self.tensors | {b.path for b in index.byte_items.values() if b.path}
        self._children: dict[KeyPath, dict[str | int, None]] = {}
        self._with_tensors: set[KeyPath] = set()
        for path in sorted(self.leaves, key=lambda p: [str(k) for k in p]):
            for k in range(len(path)):
                self._children.setdefault(path[:k], {})[path[k]] = None
        for path in self.tensors:
            self._with_tensors.update(path[:k] for k in range(len(path) + 1))

    def children(self, node: KeyPath) -> list[str | int]:
        return list(self._children.get(node, ()))

    def is_inner(self, node: KeyPath) -> bool:
        return node in self._children

    def holds_tensors(self, node: KeyPath) -> bool:
        return node in self._with_tensors

    def is_optimizer(self, node: KeyPath) -> bool:
        """Shaped like an optimizer's state dict: its ``param_groups`` list, nested or flattened into the keys.

        ``param_groups`` is the mark, not ``state``: every optimizer state dict has it (``state``
        is empty before the first step), and a model's keys are flat names, so a submodule
        called ``state`` (``state.proj.weight``) never makes a model look like an optimizer.
        """
        nested = _PARAM_GROUPS in self._children.get(node, ()) and self.is_inner((*node, _PARAM_GROUPS))
        return nested or any(str(k).startswith(f"{_PARAM_GROUPS}.") for k in self.children(node))

    def is_state(self, node: KeyPath) -> bool:
        """Training state saved next to a model (never weights)."""
        return (bool(node) and node[-1] in L.NON_MODEL_DCP_KEYS) or self.is_optimizer(node)

    def inner_nodes(self, depth: int | None = None) -> list[KeyPath]:
        """Every subtree (``depth``: down to that many levels), shallowest first."""
        nodes = [n for n in self._children if n and (depth is None or len(n) <= depth)]
        return sorted(nodes, key=lambda n: (len(n), dotted(n)))

    def states_below(self, node: KeyPath) -> tuple[KeyPath, ...]:
        """The training-state entries anywhere under ``node`` (the outermost of each)."""
        found: list[KeyPath] = []
        todo = [node]
        while todo:
            here = todo.pop()
            for child in self.children(here):
                sub = (*here, child)
                if self.is_state(sub):
                    found.append(sub)
                elif self.is_inner(sub):
                    todo.append(sub)
        return tuple(sorted(found, key=dotted))


def select(index: ChunkIndex, *, key: str | None, what: str, what_given: bool) -> Selection:
    """What to convert from ``index``: the subtree ``key`` names, else the ``what`` part found by its shape.

    ``what``: the form asked for (or the default); ``what_given``: the user said it (``--what``),
    so a ``--key`` subtree of the other kind is refused instead of followed.
    """
    tree = _Tree(index)
    if key is not None:
        return _by_key(index, tree, key, what, what_given)
    if what == "optimizer":
        return _find_optimizer(index, tree)
    return _find_model(index, tree)


def _by_key(index: ChunkIndex, tree: _Tree, key: str, what: str, what_given: bool) -> Selection:
    key = key.strip().strip(".")
    if not key:
        raise UsageError("--key: give a dotted key path, e.g. --key app.model")
    matches = [n for n in tree.inner_nodes() if dotted(n) == key]
    if not matches:
        subtrees = ", ".join(dotted(n) for n in tree.inner_nodes(depth=2)) or "none"
        raise CheckpointError(f"{index.root}: no subtree '{key}' (its subtrees: {subtrees})")
    node = matches[0]
    optimizer = tree.is_optimizer(node)
    if what_given and what == "model" and optimizer:
        raise UsageError(f"--key {key}: holds optimizer state (state, param_groups), not weights; use --what optimizer")
    if what_given and what == "optimizer" and not optimizer:
        raise UsageError(f"--key {key}: not an optimizer state dict (no param_groups); drop --what optimizer")
    return Selection(node, "optimizer") if optimizer else _model_at(tree, node, None)


def _find_model(index: ChunkIndex, tree: _Tree) -> Selection:
    """Walk down from the top while one way leads on: a ``model`` subtree, else the one non-state subtree."""
    if not tree.tensors:
        return Selection((), "model")  # nothing to pick from: the plan says there is nothing to convert
    node: KeyPath = ()
    while True:
        kids = tree.children(node)
        model = (*node, L.MODEL_DCP_KEY)
        if L.MODEL_DCP_KEY in kids and tree.is_inner(model) and not tree.is_optimizer(model):
            picked = f"converting '{dotted(model)}', the model state" if node else None
            return _model_at(tree, model, picked)
        states = [c for c in kids if tree.is_state((*node, c))]
        rest = [c for c in kids if c not in states]
        inner = [c for c in rest if tree.is_inner((*node, c)) and tree.holds_tensors((*node, c))]
        flat = [c for c in rest if not tree.is_inner((*node, c)) and (*node, c) in tree.tensors]
        if flat and not inner:
            picked = None
            if states:
                where = f"under '{dotted(node)}'" if node else "at the top level"
                picked = f"converting the {len(flat)} model entries {where}"
            return _model_at(tree, node, picked)
        if len(inner) == 1 and not flat:
            node = (*node, inner[0])
            continue
        candidates = [dotted((*node, c)) for c in inner] + (
            [f"the {len(flat)} tensors at {dotted(node) or 'the top level'}"] if flat else []
        )
        if not candidates:
            holds = ", ".join(dotted((*node, c)) for c in kids) or "nothing"
            raise CheckpointError(
                f"{index.root}: holds no model weights ({holds}: training state); use --what optimizer or --key"
            )
        raise CheckpointError(
            f"{index.root}: cannot tell which part holds the model weights: {', '.join(candidates)};"
            f" pick one with --key (e.g. --key {dotted((*node, inner[0])) if inner else dotted(node) or '...'})"
        )


def _model_at(tree: _Tree, node: KeyPath, picked: str | None) -> Selection:
    left_out = tree.states_below(node)
    if left_out:
        names = ", ".join(dotted(p) for p in left_out)
        picked = f"{picked} (left out: {names})" if picked else f"left out {names}: training state, not weights"
    return Selection(node, "model", left_out, picked)


def _find_optimizer(index: ChunkIndex, tree: _Tree) -> Selection:
    top = (L.OPTIMIZER_DCP_KEY,)
    if L.OPTIMIZER_DCP_KEY in tree.children(()) and tree.is_inner(top):
        return Selection(top, "optimizer")
    found = [n for n in tree.inner_nodes() if tree.is_optimizer(n)]
    outermost = [n for n in found if not any(n[: len(o)] == o and n != o for o in found)]
    if len(outermost) == 1:
        node = outermost[0]
        return Selection(node, "optimizer", picked=f"converting '{dotted(node)}', the optimizer state")
    if not outermost:
        holds = ", ".join(dotted((c,)) for c in tree.children(())) or "nothing"
        raise CheckpointError(f"{index.root}: holds no optimizer state ({holds})")
    names = ", ".join(dotted(n) for n in outermost)
    raise CheckpointError(f"{index.root}: several optimizer states: {names}; pick one with --key")
