"""One rank of PyTorch's DCP recipe ("Getting Started with Distributed Checkpoint"), on CPU with gloo.

Started by ``bin/make-producer-fixtures dcp-tutorial`` under torchrun (2 ranks). The code is the
recipe's save example as published (``recipes_source/distributed_checkpoint_recipe.rst``):
its ``ToyModel`` (net1 16->16, ReLU, net2 16->8) sharded with ``fully_shard``, Adam at lr 0.1,
one step, and ``dcp.save({"app": AppState(model, optimizer)}, checkpoint_id=CHECKPOINT_DIR)``
where ``AppState.state_dict`` returns ``{"model": ..., "optim": ...}`` from ``get_state_dict``.
Changed for this CPU-only machine, and nothing else: the process group is gloo, the model and
input stay on the CPU, and the checkpoint directory is ``OUT/checkpoint``.

    torchrun --nproc-per-node=2 dcp_tutorial.py OUT   # writes OUT/checkpoint/
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.fsdp import fully_shard

CHECKPOINT_DIR = "checkpoint"


class AppState(Stateful):
    """The recipe's wrapper: DCP calls ``state_dict`` / ``load_state_dict`` on it."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict:
        model_state_dict, optimizer_state_dict = get_state_dict(self.model, self.optimizer)
        return {"model": model_state_dict, "optim": optimizer_state_dict}

    def load_state_dict(self, state_dict: dict) -> None:
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state_dict["model"], optim_state_dict=state_dict["optim"]
        )


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(16, 16)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = ToyModel()
    model = fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    optimizer.zero_grad()
    model(torch.rand(8, 16)).sum().backward()
    optimizer.step()
    state_dict = {"app": AppState(model, optimizer)}
    dcp.save(state_dict, checkpoint_id=str(out / CHECKPOINT_DIR))
    dist.barrier()
    if dist.get_rank() == 0:
        (out / "DONE").write_text("ok\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
