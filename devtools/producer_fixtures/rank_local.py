"""DCP with rank-local metadata: ``dcp.save(..., use_collectives=False)`` in two gloo processes.

Each rank saves without coordinating with the others, so each writes its own ``__<r>_0.distcp``
and ``__<r>.metadata`` and no global ``.metadata`` exists. ``model/`` holds a DDP-style model
(plain tensors: every rank saves all of them) and one DTensor sharded over the two ranks
(``Shard(0)``: each rank's metadata lists only its own half). torch's loader reads the file of
its own rank (``read_metadata(rank=r)``); the whole checkpoint is the union of the files.
"""

from __future__ import annotations

from devtools.producer_fixtures.common import fresh, spawn, tensors, write_readme

NAME = "rank_local"


def _save(rank: int, world: int, out: str) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    model = dict(tensors(3))
    model["sharded.weight"] = distribute_tensor(torch.arange(24, dtype=torch.float32).reshape(6, 4), mesh, [Shard(0)])
    dcp.save({"model": model}, checkpoint_id=out, use_collectives=False)


def main() -> None:
    root = fresh(NAME)
    spawn(2, _save, str(root / "model"))
    write_readme(root, "DCP with rank-local metadata", __doc__ or "")
    print(f"wrote {root}")


if __name__ == "__main__":
    main()
