"""One rank of a tiny torchtitan training run on CPU whose checkpoints torchtitan's own CheckpointManager writes.

Started by ``bin/make-producer-fixtures torchtitan`` under torchrun (3 ranks, gloo), with
torchtitan installed from PyPI (``pip install --no-deps --target DIR torchtitan`` plus its small
pure-Python dependencies) on ``PYTHONPATH``. Everything that decides what the checkpoint holds
is torchtitan's: ``CheckpointManager`` (``components/checkpointer/dcp.py``: the step-N folders,
the model entries flattened to the top level next to ``optimizer``, ``lr_scheduler``,
``dataloader`` and ``train_state``, the model-only last step), ``OptimizersContainer`` (its
flat, FQN-keyed optimizer state), ``LRSchedulersContainer`` and ``ParallelAwareDataloader``.
Nothing of torchtitan is patched.

The model is a tiny Llama-shaped module with torchtitan's llama3 parameter names, sharded with
FSDP2 (``fully_shard``, torchtitan's data-parallel sharding) per layer and at the root over 3 ranks
(uneven row shards: 16 rows as 6, 6, 4); one layer keeps each file under 200 KB. It is not
torchtitan's own ``Llama3Model``: importing ``torchtitan.models`` pulls in its Triton kernels
(``distributed/minimal_async_ep``), which a CPU-only torch does not have. ``train_state`` is the
``{"step", "ntokens_seen"}`` that torchtitan's ``Trainer.state_dict`` returns.

    torchrun --nproc-per-node=3 torchtitan_run.py OUT   # writes OUT/checkpoint/step-2, step-4
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import IterableDataset
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.optimizer import ParamGroupConfig

DIM, HIDDEN, VOCAB, LAYERS, SEQ = 16, 32, 32, 1, 8
STEPS, INTERVAL = 4, 2


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        return self.wo(nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.attention, self.feed_forward = Attention(), FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class TinyLlama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            x = layer(x)
        return self.output(self.norm(x))


class Tokens(IterableDataset):
    """An endless stream of (input, label) token windows, different per data-parallel rank."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __iter__(self):  # type: ignore[override]
        g = torch.Generator().manual_seed(1000 + self.rank)
        while True:
            window = torch.randint(0, VOCAB, (SEQ + 1,), generator=g)
            yield {"input": window[:-1]}, window[1:]


class TrainState:
    """What torchtitan's ``Trainer.state_dict`` saves as ``train_state``."""

    def __init__(self) -> None:
        self.step, self.ntokens_seen = 0, 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step, self.ntokens_seen = state_dict["step"], state_dict["ntokens_seen"]


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    torch.manual_seed(0)
    model = TinyLlama()
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    optim_config = OptimizersContainer.Config(
        param_groups=[
            ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3, "weight_decay": 0.1})
        ],
        implementation="for-loop",  # "fused" is CUDA-only
    )
    optimizers = optim_config.build(model_parts=[model])
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optimizers, training_steps=STEPS)
    dataloader = ParallelAwareDataloader(Tokens(rank), dp_rank=rank, dp_world_size=world, batch_size=2)
    train_state = TrainState()
    checkpointer = CheckpointManager(
        CheckpointManager.Config(enable=True, interval=INTERVAL, keep_latest_k=0),
        dataloader=dataloader,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=lr_schedulers,
        states={"train_state": train_state},
        sd_adapter=None,
        base_folder=str(out),
    )
    batches = iter(dataloader)
    for step in range(1, STEPS + 1):
        inputs, labels = next(batches)
        logits = model(inputs["input"])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        loss.backward()
        optimizers.step()
        lr_schedulers.step()
        optimizers.zero_grad()
        train_state.step, train_state.ntokens_seen = step, train_state.ntokens_seen + labels.numel() * world
        checkpointer.save(step, last_step=step == STEPS)
    checkpointer.close()
    dist.barrier()
    if rank == 0:
        (out / "DONE").write_text("ok\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
