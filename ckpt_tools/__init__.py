"""ckpt_tools: checkpoint tooling for PyTorch training runs (DDP, FSDP2, HSDP).

The tool side (everything outside ``ckpt_tools.train``) reads checkpoints without torch.
Its Python API is re-exported here lazily, so ``import ckpt_tools`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY_API = {
    "convert_dcp": "ckpt_tools.convert",
    "inspect_path": "ckpt_tools.inspect",
    "plan_reshard": "ckpt_tools.resume.plan",
    "verify_resume": "ckpt_tools.resume.verify",
    "TargetRequest": "ckpt_tools.resume.target",  # what plan_reshard / verify_resume take
    "push_to_hub": "ckpt_tools.hub",
    "publish_checkpoint": "ckpt_tools.hub",
}

__all__ = ["__version__", *_LAZY_API]


def __getattr__(name: str) -> Any:
    module_name = _LAZY_API.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ckpt_tools' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
