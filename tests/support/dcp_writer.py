"""Write real DCP checkpoints with torch itself, for the converter and inspect tests.

Run under ``torchrun --nproc-per-node=4 tests/support/dcp_writer.py OUT``. One launch writes
every variant (sub-meshes let 2- and 3-rank saves happen inside the 4-rank job):

- ``fsdp2/checkpoints/{000005,000010}/``: FSDP2 over 2 ranks, a real module (tied embedding
  and head, 0-d buffers) trained one Adam step, plus exotic extras (every dtype, uneven and
  empty chunks, Shard(1), a transposed tensor, a zero-size tensor, a 10 MB tensor); model and
  optimizer DCP, sidecars, ``last`` and a crashed ``.000015.partial``.
- ``fsdp3/pytorch_model_fsdp_0``: FSDP over 3 ranks, uneven shards and an empty chunk.
- ``hsdp/checkpoints/000004/``: HSDP 2×2 (``safetensors_dcp``: DCP + gathered model.safetensors).
- ``shard2d/pytorch_model_fsdp_0``: a 2-D mesh with [Shard(0), Shard(1)] and other layouts.
- ``peft/checkpoints/000002/``: adapter-only DCP with peft-style keys and ``adapter_config.json``.

Rank 0 writes ``OUT/DONE`` last.
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from ckpt_tools.format.record import SamplerPosition, Topology, TrainingStep, training_step_json


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(6, 7)
        self.linear2 = nn.Linear(7, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(torch.relu(self.linear1(x)))


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList([Layer(), Layer()])
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight  # tied: one tensor under two names
        self.register_buffer("temperature", torch.tensor(0.5))
        self.register_buffer("count", torch.tensor(3, dtype=torch.int64))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.encoder.layers:
            h = h + layer(h)
        return self.head(h) * self.temperature


def trained(mesh: DeviceMesh) -> tuple[Tiny, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Tiny()
    for layer in model.encoder.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + dist.get_rank())
    model(torch.randint(0, 11, (4, 5))).float().pow(2).mean().backward()
    opt.step()
    return model, opt


def extras(mesh: DeviceMesh, shard: list) -> dict[str, torch.Tensor]:
    """Every dtype and awkward layout, as DTensors placed with ``shard`` (or plain tensors)."""
    torch.manual_seed(42)
    g = torch.Generator().manual_seed(7)

    def dt(t: torch.Tensor, placements: list | None = None) -> torch.Tensor:
        return distribute_tensor(t, mesh, placements or shard)

    replicate_then = [Replicate()] * (mesh.ndim - 1)
    return {
        "extras.big": dt(torch.randn(2600, 1030, generator=g)),
        "extras.bf16": dt(torch.randn(5, 3, generator=g).to(torch.bfloat16)),
        "extras.fp16": dt(torch.randn(9, 2, generator=g).to(torch.float16)),
        "extras.f64": dt(torch.randn(3, 3, generator=g, dtype=torch.float64)),
        "extras.i32": dt(torch.randint(-1000, 1000, (5,), generator=g, dtype=torch.int32)),
        "extras.i16": torch.randint(-1000, 1000, (4,), generator=g, dtype=torch.int16),
        "extras.i8": torch.randint(-100, 100, (3,), generator=g, dtype=torch.int8),
        "extras.u8": dt(torch.randint(0, 255, (6,), generator=g, dtype=torch.uint8)),
        "extras.flag": dt(torch.rand(5, generator=g) > 0.5),
        "extras.i64": dt(torch.randint(-(2**40), 2**40, (7, 2), generator=g, dtype=torch.int64)),
        "extras.one_row": dt(torch.randn(1, 4, generator=g)),  # the other shards are empty chunks
        "extras.cols": dt(torch.randn(4, 7, generator=g), [*replicate_then, Shard(1)]),
        "extras.transposed": torch.randn(6, 4, generator=g).t(),  # stride (1, 4), saved as is
        "extras.scalar_f": torch.tensor(2.75),
        "extras.scalar_i": torch.tensor(-5, dtype=torch.int64),
        "extras.empty": torch.zeros(0, 3),
    }


def sidecars(step_dir: Path, record: TrainingStep, *, peft: bool = False) -> None:
    pm, ts = step_dir / "pretrained_model", step_dir / "training_state"
    pm.mkdir(parents=True, exist_ok=True)
    ts.mkdir(parents=True, exist_ok=True)
    (pm / "config.json").write_text(json.dumps({"type": "tiny"}))
    (pm / "train_config.json").write_text(json.dumps({"policy": {"type": "tiny"}, "steps": 10}))
    (pm / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": []}))
    if peft:
        (pm / "adapter_config.json").write_text(
            json.dumps({"peft_type": "LORA", "r": 2, "base_model_name_or_path": "base", "target_modules": ["linear1"]})
        )
    save_file({"cpu": torch.zeros(4, dtype=torch.uint8)}, str(ts / "rng_state.safetensors"))
    (ts / "scheduler_state.json").write_text(json.dumps({"last_epoch": record.step}))
    (ts / "training_step.json").write_text(training_step_json(record))


def record(step: int, world: int, r: int, s: int, fmt: str, *, peft: bool = False) -> TrainingStep:
    return TrainingStep(
        step=step,
        samples_seen=step * 4 * world,
        optimizer_steps=step,
        dp_world_size=world,
        batch_size=4,
        grad_accum_steps=1,
        mixed_precision="no",
        checkpoint_format=fmt,
        topology=Topology(world_size=world, dp_replicate=r, dp_shard=s, nnodes=1),
        sampler=SamplerPosition(epoch=0, offset=step * 4 * world, seed=0, dataset_size=1000),
        sharded=True,
        peft=peft,
        versions={"torch": torch.__version__},
    )


def fsdp2(out: Path, rank: int) -> None:
    mesh = DeviceMesh("cpu", [0, 1])
    if rank < 2:
        model, opt = trained(mesh)
        root = out / "fsdp2" / "checkpoints"
        step = root / "000010"
        msd = {**get_model_state_dict(model), **extras(mesh, [Shard(0)])}
        dcp.save(
            {"model": msd},
            checkpoint_id=step / "pretrained_model" / "pytorch_model_fsdp_0",
            process_group=mesh.get_group(),
        )
        osd = get_optimizer_state_dict(model, opt)
        dcp.save(
            {"optimizer": osd}, checkpoint_id=step / "training_state" / "optimizer_0", process_group=mesh.get_group()
        )
        if rank == 0:
            sidecars(step, record(10, 2, 1, 2, "dcp"))
            shutil.copytree(step, root / "000005")
            (root / "000005" / "training_state" / "training_step.json").write_text(
                training_step_json(record(5, 2, 1, 2, "dcp"))
            )
            (root / "last").symlink_to("000010")
            partial = root / ".000015.partial" / "pretrained_model"
            partial.mkdir(parents=True)
            (partial / "config.json").write_text("{}")
        del model, opt
    dist.barrier()


def fsdp3(out: Path, rank: int) -> None:
    mesh = DeviceMesh("cpu", [0, 1, 2])
    if rank < 3:
        g = torch.Generator().manual_seed(3)
        sd = {
            "w": distribute_tensor(torch.randn(10, 4, generator=g), mesh, [Shard(0)]),
            "tiny": distribute_tensor(torch.randn(2, 3, generator=g), mesh, [Shard(0)]),
            "bias": distribute_tensor(torch.randn(5, generator=g), mesh, [Shard(0)]),
            "bf16": distribute_tensor(torch.randn(7, 3, generator=g).to(torch.bfloat16), mesh, [Shard(0)]),
            "ids": distribute_tensor(torch.arange(8, dtype=torch.int64), mesh, [Shard(0)]),
            "scale": torch.tensor(1.5),
        }
        dcp.save({"model": sd}, checkpoint_id=out / "fsdp3" / "pytorch_model_fsdp_0", process_group=mesh.get_group())
    dist.barrier()


def hsdp(out: Path, rank: int) -> None:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    model, opt = trained(mesh)
    step = out / "hsdp" / "checkpoints" / "000004"
    msd = {**get_model_state_dict(model), **extras(mesh, [Replicate(), Shard(0)])}
    dcp.save({"model": msd}, checkpoint_id=step / "pretrained_model" / "pytorch_model_fsdp_0")
    dcp.save({"optimizer": get_optimizer_state_dict(model, opt)}, checkpoint_id=step / "training_state" / "optimizer_0")
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        full = {k: v.clone().contiguous() for k, v in full.items()}
        save_file(full, str(step / "pretrained_model" / "model.safetensors"), metadata={"format": "pt"})
        sidecars(step, record(4, 4, 2, 2, "safetensors_dcp"))
        (step.parent / "last").symlink_to("000004")
    del model, opt
    dist.barrier()


def shard2d(out: Path, rank: int) -> None:
    mesh = init_device_mesh("cpu", (2, 2))
    g = torch.Generator().manual_seed(11)
    sd = {
        "grid": distribute_tensor(torch.randn(6, 10, generator=g), mesh, [Shard(0), Shard(1)]),
        "grid_uneven": distribute_tensor(torch.randn(5, 7, generator=g), mesh, [Shard(1), Shard(0)]),
        "rows_twice": distribute_tensor(torch.randn(9, 3, generator=g), mesh, [Shard(0), Shard(0)]),
        "grid_bf16": distribute_tensor(torch.randn(4, 6, generator=g).to(torch.bfloat16), mesh, [Shard(0), Shard(1)]),
        "cube": distribute_tensor(torch.randn(3, 4, 5, generator=g), mesh, [Shard(2), Shard(1)]),
    }
    dcp.save({"model": sd}, checkpoint_id=out / "shard2d" / "pytorch_model_fsdp_0")
    dist.barrier()


def peft(out: Path, rank: int) -> None:
    mesh = DeviceMesh("cpu", [0, 1])
    if rank < 2:
        g = torch.Generator().manual_seed(5)
        sd = {}
        for i in range(2):
            base = f"base_model.model.encoder.layers.{i}.linear1"
            sd[f"{base}.lora_A.default.weight"] = distribute_tensor(torch.randn(2, 6, generator=g), mesh, [Shard(0)])
            sd[f"{base}.lora_B.default.weight"] = distribute_tensor(torch.randn(7, 2, generator=g), mesh, [Shard(0)])
        sd["base_model.model.head.modules_to_save.default.weight"] = distribute_tensor(
            torch.randn(11, 6, generator=g), mesh, [Shard(0)]
        )
        step = out / "peft" / "checkpoints" / "000002"
        dcp.save(
            {"model": sd},
            checkpoint_id=step / "pretrained_model" / "pytorch_model_fsdp_0",
            process_group=mesh.get_group(),
        )
        if rank == 0:
            sidecars(step, record(2, 2, 1, 2, "dcp", peft=True), peft=True)
    dist.barrier()


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    assert dist.get_world_size() == 4, "run with --nproc-per-node=4"
    for write in (fsdp2, fsdp3, hsdp, shard2d, peft):
        write(out, rank)
    if rank == 0:
        (out / "DONE").write_text("ok")
    dist.barrier()
    gc.collect()  # drop gloo work before teardown: avoids gloo's exit-time abort (see train.parallel.distributed.teardown)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
