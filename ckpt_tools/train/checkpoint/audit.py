"""What a resume really read and holds, per rank: ``<output_dir>/resume_audit/rank<R>.json``.

``ckpt-tools reshard-plan`` predicts, without torch, which shard bytes each rank of a new
topology reads and how much parameter, gradient and optimizer memory it keeps. This file
is the measured side of that claim: the DCP read requests torch's own reader made (per
file, relative to the step dir) and the local tensor bytes after the load.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed.checkpoint.metadata import Metadata

from ckpt_tools.train.checkpoint.safe_dcp import DirectFileSystemReader


class CountingReader(DirectFileSystemReader):
    """A DCP reader that records the span of every read request, per shard file."""

    def __init__(self, path: str | Path, metadata: Metadata | None = None) -> None:
        super().__init__(path, metadata)
        self.requested: dict[str, int] = defaultdict(int)

    def _slice_file(self, file: Any, sinfo: Any) -> IO[bytes]:
        self.requested[sinfo.relative_path] += int(sinfo.length)
        return super()._slice_file(file, sinfo)


def local_bytes(tensor: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def resident_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    params = [p for p in model.parameters()]
    trainable = [p for p in params if p.requires_grad]
    optimizer_bytes = sum(
        local_bytes(v) for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)
    )
    return {
        "params": sum(local_bytes(p) for p in params),
        "grads": sum(local_bytes(p) for p in trainable),  # a gradient has its parameter's local shape
        "optimizer": optimizer_bytes,
    }


def write_audit(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
