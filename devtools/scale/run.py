"""The training run a generated checkpoint claims to come from, in the trainer's own terms.

A checkpoint is more than its shards: ``train_config.json``, the record, the scheduler and the
optimizer's hyper-parameters must all tell the same story, or the tools rightly call it
inconsistent. :class:`TrainingRun` is that story (the step, the batch, the world); everything
derived from it is computed by the code the trainer itself runs - its ``TrainConfig`` and
draccus encoding, its LR schedule over torch's ``LambdaLR``, torch's AdamW and
``get_optimizer_state_dict`` - so the values are the ones a real run at that step would save.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ckpt_tools.format.record import SamplerPosition, Topology, TrainingStep
from devtools.procs import REPO
from devtools.scale.shapes import LlamaShape
from devtools.scale.world import World

FIXTURE_DATASET = REPO / "fixtures" / "tiny_robot"


@dataclass(frozen=True)
class TrainingRun:
    """The run a generated step belongs to, as far as its files tell."""

    step: int = 100  # the saved step
    steps: int = 1000  # the run's length (the schedule's horizon)
    batch_size: int = 4  # per data-parallel worker
    dataset_root: Path = FIXTURE_DATASET

    def samples_seen(self, world: World) -> int:
        return self.step * self.batch_size * world.size


def train_config(world: World, run: TrainingRun, output_dir: Path) -> Any:
    """The trainer's ``TrainConfig`` for this run (its policy left out: no ckpt-train policy is a Llama)."""
    from ckpt_tools.train.config import DatasetConfig, ParallelismConfig, TrainConfig

    return TrainConfig(
        dataset=DatasetConfig(root=str(run.dataset_root.resolve())),
        output_dir=str(output_dir.resolve()),
        steps=run.steps,
        batch_size=run.batch_size,
        save_freq=run.step,
        checkpoint_format="dcp",
        progress_bar=False,
        parallelism=ParallelismConfig(dp_replicate=world.dp_replicate, dp_shard=world.dp_shard),
    )


def train_config_json(shape: LlamaShape, cfg: Any) -> dict[str, Any]:
    """``train_config.json`` as the trainer encodes it, with the Llama's policy config in its place."""
    from ckpt_tools.train.config import train_config_dict

    encoded = train_config_dict(cfg)
    encoded["policy"] = shape.policy_config()
    return encoded


def dataset_size(root: Path) -> int:
    """Samples in the dataset, read as ``verify-resume`` reads them (so its dataset check agrees)."""
    from ckpt_tools.format import dataset
    from ckpt_tools.st.header import read_header

    shape = read_header(root / dataset.FRAMES_FILE).entries[dataset.LENGTH_COLUMN].shape
    return int(shape[0])


@dataclass(frozen=True)
class OptimizerState:
    """What torch's AdamW and the trainer's schedule hold at the saved step."""

    param_groups: list[dict[str, Any]]  # get_optimizer_state_dict's, parameters by name
    scheduler: dict[str, Any]  # LambdaLR.state_dict()


def optimizer_state(shape: LlamaShape, cfg: Any, step: int) -> OptimizerState:
    """Build the trainer's AdamW and schedule on a tiny model with the same parameter names, step them.

    Only names and hyper-parameters come out of it, so the model's sizes do not matter: every
    dimension is shrunk to 1 (or the few a Llama needs), the layer count kept.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from ckpt_tools.train.loop import make_scheduler
    from devtools.scale.llama import Llama

    tiny = LlamaShape(shape.name, dim=2, n_layers=shape.n_layers, n_heads=1, n_kv_heads=1, ffn_dim=1, vocab_size=1)
    model = Llama(tiny)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.optimizer.lr,
        betas=tuple(cfg.optimizer.betas),
        eps=cfg.optimizer.eps,
        weight_decay=cfg.optimizer.weight_decay,
    )
    scheduler = make_scheduler(cfg, optimizer)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # the state exists from the first update on
    for _ in range(step):
        scheduler.step()
    groups = get_optimizer_state_dict(model, optimizer)["param_groups"]
    names = [name for name, _ in shape.parameters()]
    if groups[0]["params"] != names:
        raise AssertionError("the optimizer's parameter names differ from the model's")
    return OptimizerState(groups, scheduler.state_dict())


def training_step(world: World, run: TrainingRun, size: int, seed: int) -> TrainingStep:
    """The record the trainer writes last (``CheckpointManager.record``), for the generated world."""
    import ckpt_tools

    seen = run.samples_seen(world)
    epoch, offset = divmod(seen, size)
    topology = Topology(world.size, world.dp_replicate, world.dp_shard, nnodes=world.nnodes)
    return TrainingStep(
        step=run.step,
        samples_seen=seen,
        optimizer_steps=run.step,
        adam_step=run.step,
        dp_world_size=topology.dp_world_size,
        batch_size=run.batch_size,
        grad_accum_steps=1,
        mixed_precision="no",
        mixed_precision_policy=None,
        checkpoint_format="dcp",
        topology=topology,
        sampler=SamplerPosition(epoch=epoch, offset=offset, seed=seed, dataset_size=size),
        sharded=True,
        peft=False,
        versions={"torch": torch.__version__, "ckpt_tools": ckpt_tools.__version__},
    )
