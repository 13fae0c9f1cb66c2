"""Saving torch state dicts as safetensors: streamed tensor by tensor, atomically.

The header comes from shapes and dtypes alone, then each tensor's bytes go straight from
its storage to the file (``ckpt_tools.st.writer``: temporary sibling, fsync, rename), so a
multi-GB optimizer state never needs a second in-memory copy. Tied tensors are simply
written under each of their names.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ckpt_tools.errors import CheckpointError
from ckpt_tools.st.writer import StreamingWriter, TensorToWrite

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


def tensor_to_write(name: str, tensor: torch.Tensor) -> TensorToWrite:
    if tensor.dtype not in SAFETENSORS_DTYPES:
        raise CheckpointError(f"{name}: dtype {tensor.dtype} has no safetensors code")
    return TensorToWrite(
        name, SAFETENSORS_DTYPES[tensor.dtype], tuple(tensor.shape), tensor.numel() * tensor.element_size()
    )


def as_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy when it is contiguous on the host (bf16/bool via an integer view)."""
    t = tensor.detach().contiguous().cpu()
    if t.dtype is torch.bfloat16:
        t = t.view(torch.int16)
    elif t.dtype is torch.bool:
        t = t.view(torch.uint8)
    return memoryview(t.numpy()).cast("B") if t.numel() else memoryview(b"")


def save_state_dict(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write ``state`` (plain tensors, any device) to ``path`` atomically."""
    writer = StreamingWriter(
        path, [tensor_to_write(n, t) for n, t in state.items()], {"format": "pt", **(metadata or {})}
    )
    try:
        writer.open()
        for name, tensor in state.items():
            writer.begin(name)
            writer.write(as_bytes(tensor))
            writer.end()
        writer.finish()
        writer.commit()
    except BaseException:
        writer.abort()
        raise
