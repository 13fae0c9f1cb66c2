"""torch's ``HuggingFaceStorageWriter`` (torch.distributed.checkpoint.hf_storage), in its three forms.

- ``full/``: one process saving a full state dict (``dcp.save(..., no_dist=True)``) into two files
  chosen by ``fqn_to_index_mapping``: ``model-0000{1,2}-of-00002.safetensors`` and
  ``model.safetensors.index.json``; each header still carries ``DCP_SHARDING_INFO`` (all offsets 0).
- ``distributed/``: three gloo processes saving DTensors with ``save_distributed=True``: every rank
  writes its own ``shard-0000<r>-model-00001-of-00001.safetensors`` holding its pieces, each
  header's ``DCP_SHARDING_INFO`` giving each piece's ``saved_offsets``; no index, no ``.metadata``.
- ``consolidated/``: the same save with ``enable_consolidation=True``: the pieces in ``sharded/``
  and torch's merged ``model-00001-of-00001.safetensors`` + index next to it. Without the integer
  tensor ``steps``: torch 2.13's consolidation sizes elements with ``torch.finfo``, which raises on
  an integer dtype.

``expected.safetensors`` (written with safetensors' own ``save_file``) holds the full tensors the
ranks started from, so a test can check the pieces against what was saved, not only against
torch's reader.
"""

from __future__ import annotations

from devtools.producer_fixtures.common import fresh, spawn, tensors, write_readme

NAME = "hf_storage"


def _placements() -> dict[str, str]:
    return {"embed.weight": "S0", "proj.weight": "S1", "head.weight": "S0", "head.bias": "R", "steps": "R"}


def _distributed(rank: int, world: int, out: str, consolidate: bool) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    kinds = {"S0": Shard(0), "S1": Shard(1), "R": Replicate()}
    # torch 2.13's consolidation sizes elements with torch.finfo, which refuses integer tensors.
    saved = {k: v for k, v in tensors().items() if v.is_floating_point() or not consolidate}
    state = {k: distribute_tensor(v, mesh, [kinds[_placements()[k]]]) for k, v in saved.items()}
    writer = HuggingFaceStorageWriter(out, save_distributed=True, enable_consolidation=consolidate)
    dcp.save(state, storage_writer=writer)


def main() -> None:
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

    root = fresh(NAME)
    save_file(tensors(), str(root / "expected.safetensors"))
    full = root / "full"
    mapping = {k: (1 if i < 3 else 2) for i, k in enumerate(tensors())}
    dcp.save(tensors(), storage_writer=HuggingFaceStorageWriter(str(full), fqn_to_index_mapping=mapping), no_dist=True)
    spawn(3, _distributed, str(root / "distributed"), False)
    spawn(3, _distributed, str(root / "consolidated"), True)
    write_readme(
        root,
        "torch's Hugging Face storage writer",
        __doc__ or "",
    )
    print(f"wrote {root}")


if __name__ == "__main__":
    main()
