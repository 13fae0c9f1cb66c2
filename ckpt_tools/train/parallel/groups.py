"""Which ranks each collective of the mesh joins, and on which node each rank runs.

Multi-node HSDP pays off only when the shard groups (an all-gather and a reduce-scatter per
wrap unit, every step) stay inside one node and the replica all-reduce is the one collective
that crosses the network. The start-up banner says which group crosses, measured from the
mesh this run built and from each rank's node as torchrun numbered it (``GROUP_RANK``), not
assumed from the flags.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ckpt_tools.train.parallel.distributed import DistEnv


@dataclass(frozen=True)
class MeshGroups:
    """Per mesh dimension, its groups of global ranks; and each rank's node index."""

    groups: dict[str, list[list[int]]]
    node_of_rank: list[int]

    @property
    def nodes(self) -> list[list[int]]:
        count = max(self.node_of_rank) + 1
        return [[r for r, node in enumerate(self.node_of_rank) if node == n] for n in range(count)]

    def crosses_nodes(self, dim: str) -> bool:
        return any(len({self.node_of_rank[r] for r in group}) > 1 for group in self.groups[dim])

    def describe(self) -> str:
        parts = []
        for dim, groups in self.groups.items():
            where = "crosses nodes" if self.crosses_nodes(dim) else "node-local"
            parts.append(f"{dim} {groups} {where}")
        nodes = " ".join(str(ranks) for ranks in self.nodes)
        return f"{'; '.join(parts)} ({len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''}: {nodes})"


def node_indices(env: DistEnv) -> list[int]:
    """Collective: every rank's node index (torchrun's ``GROUP_RANK``), on every rank."""
    mine = int(os.environ.get("GROUP_RANK", "0"))
    if not env.distributed:
        return [mine]
    out: list[int | None] = [None] * env.world_size
    dist.all_gather_object(out, mine)
    return [int(node) for node in out if node is not None]


def mesh_groups(env: DistEnv, mesh: Any) -> MeshGroups:
    """Collective: the groups of each dimension of ``mesh`` (None: one data-parallel group of all ranks)."""
    nodes = node_indices(env)
    if mesh is None:
        return MeshGroups({"dp": [list(range(env.world_size))]}, nodes)
    ranks = mesh.mesh  # the global rank at each mesh coordinate
    groups: dict[str, list[list[int]]] = {}
    for dim, name in enumerate(mesh.mesh_dim_names):
        moved = ranks.movedim(dim, -1).reshape(-1, ranks.shape[dim])
        groups[name] = [[int(r) for r in row] for row in moved]
    return MeshGroups(groups, nodes)
