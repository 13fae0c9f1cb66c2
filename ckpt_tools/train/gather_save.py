"""Gathered ``model.safetensors`` streamed from the gather, one tensor at a time.

The naive path gathers the whole model onto the main rank (one full copy), then serializes
it into a bytes blob (a second copy) before writing. Here the header is computed from the
sharded state dict's global shapes, then each tensor is gathered to the main rank alone
(``dist.gather`` over the shard group; other replicas of an HSDP run hold the same bytes
and stay out) and written straight from the gathered buffer. Peak extra memory: one full
tensor on the main rank, one padded local shard elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from ckpt_tools.errors import CheckpointError
from ckpt_tools.st_writer import StreamingWriter, TensorSpec
from ckpt_tools.train.distributed import DistEnv
from ckpt_tools.train.parallel import ParallelModel

SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def tensor_spec(name: str, tensor: torch.Tensor) -> TensorSpec:
    shape = tuple(tensor.shape)  # a DTensor reports its global shape
    return TensorSpec(name, SAFETENSORS_DTYPES[tensor.dtype], shape, tensor.numel() * tensor.element_size())


def as_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (a view through an integer dtype for bf16)."""
    t = tensor.detach().contiguous().cpu()
    if t.dtype is torch.bfloat16:
        t = t.view(torch.int16)
    if t.dtype is torch.bool:
        t = t.view(torch.uint8)
    return memoryview(t.numpy()).cast("B") if t.numel() else memoryview(b"")


class ShardGatherer:
    """Gathers dim-0 (FSDP2) shards of a DTensor onto the main rank over one shard group.

    ``group`` is the dp_shard group this rank belongs to (None: not sharded);
    ``in_first_replica`` says whether this rank's group is the one that sends (HSDP replicas
    other than the first hold the same bytes and stay out).
    """

    def __init__(self, env: DistEnv, group: Any, in_first_replica: bool, background: bool) -> None:
        self.env = env
        self.group = group
        self.in_first_replica = in_first_replica
        self.background = background

    @classmethod
    def for_training(cls, parallel: ParallelModel, env: DistEnv) -> ShardGatherer:
        if not (parallel.sharded and parallel.mesh is not None):
            return cls(env, None, True, background=False)
        return cls(env, parallel.mesh.get_group("dp_shard"), _first_replica(parallel), background=False)

    @classmethod
    def for_background(cls, parallel: ParallelModel, env: DistEnv) -> ShardGatherer:
        """Collective: a gloo group per shard row of the mesh (every rank creates every group, in order)."""
        if not (parallel.sharded and parallel.mesh is not None):
            return cls(env, None, True, background=True)
        rows = parallel.mesh.mesh.reshape(-1, parallel.dp_shard).tolist()
        mine = None
        for row in rows:
            group = dist.new_group(ranks=row, backend="gloo")
            if env.rank in row:
                mine = group
        return cls(env, mine, _first_replica(parallel), background=True)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """Collective over the first replica's shard group: the full tensor on the main rank, else None."""
        if not isinstance(tensor, DTensor):
            return tensor.detach() if self.env.is_main else None
        if not _dim0_sharded(tensor):
            if self.background:  # the training mesh's collectives belong to the loop's thread
                raise CheckpointError(
                    f"--checkpoint_async=true saves dim-0 sharded tensors only; got {tensor.placements}"
                )
            full = tensor.full_tensor()  # other layouts: torch's own (all-gather) path
            return full if self.env.is_main else None
        if not self.in_first_replica:
            return None
        group_size = dist.get_world_size(self.group)
        rows = tensor.shape[0]
        per_rank = -(-rows // group_size)  # torch.chunk: ceil-sized chunks, short or empty tail
        local = tensor.to_local()
        padded = local.new_zeros((per_rank, *tensor.shape[1:]))
        padded[: local.shape[0]].copy_(local)
        if not self.env.is_main:
            dist.gather(padded, None, group_dst=0, group=self.group)
            return None
        # Receive straight into one buffer (dim-0 chunks of a contiguous tensor are contiguous).
        full = padded.new_empty((per_rank * group_size, *tensor.shape[1:]))
        dist.gather(padded, list(full.chunk(group_size)), group_dst=0, group=self.group)
        return full[:rows]


def _first_replica(parallel: ParallelModel) -> bool:
    mesh = parallel.mesh
    if "dp_replicate" in (mesh.mesh_dim_names or ()):
        return mesh.get_local_rank("dp_replicate") == 0
    return True


def _dim0_sharded(tensor: DTensor) -> bool:
    names = tensor.device_mesh.mesh_dim_names or ()
    for name, placement in zip(names, tensor.placements, strict=True):
        expected = Shard if name == "dp_shard" else Replicate
        if type(placement) is not expected or (isinstance(placement, Shard) and placement.dim != 0):
            return False
    return tensor.ndim > 0


def save_gathered(state: dict[str, Any], path: Path, gatherer: ShardGatherer, env: DistEnv) -> None:
    """Collective: write ``state`` (sharded or plain tensors) as one safetensors file on the main rank."""
    specs = [tensor_spec(name, t) for name, t in state.items()]
    writer = StreamingWriter(path, specs, metadata={"format": "pt"}) if env.is_main else None
    try:
        if writer is not None:
            writer.open()
        for name, tensor in state.items():
            full = gatherer.gather(tensor)
            if writer is not None:
                assert full is not None
                writer.begin(name)
                writer.write(as_bytes(full))
                writer.end()
            del full
        if writer is not None:
            writer.finish()
            writer.commit()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
