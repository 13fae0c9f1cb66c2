"""The states a checkpoint can be in when a tool first looks at it, and how each is produced.

- ``indexed``: the DCP directories carry the chunk index the trainer writes beside
  ``.metadata`` at every save, so a tool can read it instead of unpickling ``.metadata``;
- ``foreign``: a checkpoint someone else wrote (no index) on the tools' first look - their
  cache directory empty;
- ``warm``: the same foreign checkpoint looked at again, the tools' cache filled by the look
  before.

The tools' cache lives where ``CKPT_TOOLS_CACHE_DIR`` points: each measured run gets its own
directory under the benchmark's work dir, so the user's cache is never touched and a first
look is really a first look. A state this checkout cannot produce yet is reported, not failed:
``indexed`` needs the trainer's index writer (the hook: :mod:`devtools.scale.trainer_index`),
``warm`` a cache the tools fill.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ckpt_tools.format import layout

STATES = ("indexed", "foreign", "warm")
CACHE_ENV = "CKPT_TOOLS_CACHE_DIR"


def dcp_dirs(step: Path) -> list[Path]:
    paths = layout.StepPaths(step)
    return [paths.model_dcp, paths.optimizer_dcp]


def indexed_copy(run_dir: Path, into: Path, env: dict[str, str]) -> Path | str:
    """A copy of ``run_dir``'s last step whose DCP directories carry the trainer's index, or why there is none.

    The copy is made of hard links (no data is copied, the sparse files stay shared) with the
    index files added by :mod:`devtools.scale.trainer_index` in a child process (it needs
    torch), so the foreign original stays as it was. Reused when already made.
    """
    source = (run_dir / layout.CHECKPOINTS_DIR / layout.LAST_LINK).resolve()
    target = into / layout.CHECKPOINTS_DIR / source.name
    done = into / ".indexed"
    if done.exists():
        return target
    for path in sorted(source.rglob("*")):
        dest = target / path.relative_to(source)
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        elif not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, dest)
    cmd = [sys.executable, "-m", "devtools.scale.trainer_index", *map(str, dcp_dirs(target))]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return lines[-1].removeprefix("error: ") if lines else f"the index writer failed (exit {proc.returncode})"
    last = into / layout.CHECKPOINTS_DIR / layout.LAST_LINK
    if not last.is_symlink():
        last.symlink_to(source.name)
    done.touch()
    return target


def cache_filled(cache: Path) -> bool:
    """Whether a tool run left anything in its cache directory (no cache yet: nothing)."""
    return cache.is_dir() and any(p.is_file() for p in cache.rglob("*"))
