"""Read a sharded ``*.safetensors.index.json``: which shard file holds each tensor.

Loaders (``transformers``, ``safetensors``) open each shard as a sibling of the index, so a
shard name must be a plain file name: one that looks like a path would reach outside the
folder. ``inspect`` and ``push`` both read the index here, so both refuse the same files.
"""

from __future__ import annotations

import os

from ckpt_tools.errors import CheckpointError
from ckpt_tools.io.remote import as_path
from ckpt_tools.io.safe_read import read_json


def read_index(path: str | os.PathLike[str]) -> dict[str, str]:
    """The ``weight_map`` (tensor name → shard file name); :class:`CheckpointError` in one line otherwise."""
    p = as_path(path)
    try:
        doc = read_json(p)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{p}: not a valid safetensors index ({e})") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{p}: not a valid safetensors index (no 'weight_map' object)")
    for name in weight_map.values():
        if not _plain_file_name(name):
            raise CheckpointError(
                f"{p}: not a valid safetensors index (shard {str(name)[:60]!r} is not a plain file name)"
            )
    return dict(weight_map)


def _plain_file_name(name: object) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
