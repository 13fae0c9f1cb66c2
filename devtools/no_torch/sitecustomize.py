"""Put this directory first on PYTHONPATH to run a process in which torch is not installed.

It proves that the tool side of ckpt_tools never needs torch. A finder placed first refuses
``torch`` the way a missing package is refused: ``import torch`` raises ModuleNotFoundError, and
so does ``importlib.util.find_spec("torch")`` (which ckpt-train uses to check for its training
extra without paying for the import).
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder


class _NoTorch(MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname == "torch" or fullname.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch' (blocked: ckpt_tools tools must not import it)")
        return None


sys.meta_path.insert(0, _NoTorch())
