"""The commands the scale benchmark times, each run as a fresh process.

The reference is torch's own reading of both DCP directories (``FileSystemReader.read_metadata``,
import included): what any torch-based tool pays before it knows what a checkpoint holds. The
tools are ``ckpt-tools`` commands on the step directory, run through this interpreter
(``python -m ckpt_tools.cli``): inspect, verify-resume on the saved topology and on half the
world size, reshard-plan onto half, and convert-dcp's dry run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from devtools.scale.states import dcp_dirs
from devtools.scale.world import World

TORCH_READ = (
    "import sys\n"
    "from torch.distributed.checkpoint import FileSystemReader\n"
    "metadata = [FileSystemReader(d).read_metadata() for d in sys.argv[1:]]\n"
)


FLOORS = (
    ("python -c pass", "pass"),
    ("import torch.distributed.checkpoint", "import torch.distributed.checkpoint"),
    ("import ckpt_tools.cli", "import ckpt_tools.cli"),
)


@dataclass(frozen=True)
class Command:
    key: str  # what --tools selects
    label: str  # what the table shows
    argv: tuple[str, ...]


def floors() -> list[Command]:
    """What any command here pays before it reads a byte: the interpreter, torch's import, the tools' import."""
    return [Command(f"floor-{i}", label, (sys.executable, "-c", code)) for i, (label, code) in enumerate(FLOORS)]


def torch_read(step: Path) -> Command:
    return Command(
        "torch", "torch read_metadata (both DCP dirs)", (sys.executable, "-c", TORCH_READ, *map(str, dcp_dirs(step)))
    )


def half_flags(world: World) -> tuple[str, ...]:
    half = world.halved()
    return ("--nproc", str(half.size), "--dp-replicate", str(half.dp_replicate), "--dp-shard", str(half.dp_shard))


def tool_commands(step: Path, world: World) -> list[Command]:
    cli = (sys.executable, "-m", "ckpt_tools.cli")
    s, half = str(step), half_flags(world)
    n = world.halved().size
    return [
        Command("inspect", "inspect", (*cli, "inspect", s)),
        Command("verify", "verify-resume (same topology)", (*cli, "verify-resume", s)),
        Command("verify-half", f"verify-resume --nproc {n}", (*cli, "verify-resume", s, *half)),
        Command("plan-half", f"reshard-plan --nproc {n}", (*cli, "reshard-plan", s, *half)),
        Command("convert-dry", "convert-dcp --dry-run", (*cli, "convert-dcp", s, "--dry-run", "--quiet")),
    ]


TOOLS = ("inspect", "verify", "verify-half", "plan-half", "convert-dry")
