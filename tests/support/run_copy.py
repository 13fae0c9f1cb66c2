"""Copies of trainer runs that tests may change: the original fixture stays as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def copy_run(src: Path, dst: Path) -> Path:
    """A copy of a whole run whose configs name ``dst`` as their output_dir (as if it had run there)."""
    shutil.copytree(src, dst, symlinks=True)
    for config in dst.glob("checkpoints/0*/pretrained_model/train_config.json"):
        doc = json.loads(config.read_text())
        doc["output_dir"] = str(dst)
        config.write_text(json.dumps(doc))
    return dst
