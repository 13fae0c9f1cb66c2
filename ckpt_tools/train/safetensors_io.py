"""Saving torch state dicts as safetensors, atomically, with tied tensors kept by name."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save

from ckpt_tools.fsutil import atomic_write


def save_state_dict(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write ``state`` to ``path`` atomically.

    safetensors refuses two names over one storage, but a tied head and embedding must both
    be loadable by name: duplicates are written as separate copies. Tensors are made
    contiguous and moved to CPU first.
    """
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        t = tensor.detach().to("cpu")
        storage = t.untyped_storage().data_ptr()
        if (t.numel() and storage in seen) or not t.is_contiguous():
            t = t.contiguous().clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    blob = save(out, metadata={"format": "pt", **(metadata or {})})
    with atomic_write(path) as handle:
        handle.write(blob)
