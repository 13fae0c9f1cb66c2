"""What every producer-fixture script shares: a clean output dir, a gloo group, the README.

A producer that only works across processes (torch's distributed HF-storage pieces, rank-local
DCP metadata) is started here with ``torch.multiprocessing`` on a local gloo group - a real
multi-process save, no torchrun needed.
"""

from __future__ import annotations

import datetime
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "producers"


def fresh(name: str) -> Path:
    """``fixtures/producers/<name>/``, emptied."""
    out = FIXTURES / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(world: int, fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` processes of one gloo group."""
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(world, _free_port(), fn, args), nprocs=world, join=True)


def write_readme(out: Path, title: str, body: str) -> None:
    """The fixture's README: what wrote it (torch and safetensors versions, date) and how to rebuild it."""
    import safetensors
    import torch

    script = f"devtools/producer_fixtures/{out.name}.py"
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    listing = "\n".join(f"- `{f}` ({(out / f).stat().st_size} bytes)" for f in files)
    text = (
        f"# fixtures/producers/{out.name}: {title}\n\n{body.strip()}\n\n"
        f"Written by `{script}` (`python -m devtools.producer_fixtures.{out.name}`) with torch {torch.__version__}"
        f" and safetensors {safetensors.__version__} on {datetime.date.today().isoformat()}; nothing was edited"
        f" afterwards.\n\n## Files\n\n{listing}\n"
    )
    (out / "README.md").write_text(text, encoding="utf-8")


def tensors(seed: int = 0) -> dict[str, Any]:
    """A small model's state dict: shapes that split evenly, unevenly and along dim 1 over 3 ranks."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(9, 5, generator=g),  # Shard(0) over 3: [3, 5] slices of [9, 5]
        "proj.weight": torch.randn(4, 6, generator=g),  # Shard(1) over 3: [4, 2] slices
        "head.weight": torch.randn(7, 3, generator=g).to(torch.bfloat16),  # uneven: 3, 3, 1 rows
        "head.bias": torch.randn(5, generator=g),  # replicated
        "steps": torch.tensor([3, 1, 4], dtype=torch.int64),  # replicated, not floating
    }
