"""Launch the real training entry point (plain or under torchrun) and read what it wrote.

Imports without torch, so that the torch-free fuzz runner builds its launches here too; the
readers below that need torch import it when called.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devtools.procs import (
    REPO,
    free_port,
    kill_tree,
    launch_env,
    multinode_torchrun_commands,
    refuse_if_in_process_only,
    script,
    torchrun_command,
)

if TYPE_CHECKING:
    import torch

FIXTURE_DATASET = REPO / "fixtures" / "tiny_robot"
LEGACY_CHECKPOINT = REPO / "fixtures" / "legacy_0_6_x"  # a step dir in the 0.6.x layout (bin/make-legacy-checkpoint)

# Small and fast: every multi-process launch costs seconds of start-up on 2 cores.
TINY = [
    f"--dataset.root={FIXTURE_DATASET}",
    "--policy.type=act",
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_heads=2",
    "--batch_size=8",
    "--optimizer.lr=1e-3",
    "--log_freq=1",
    "--progress_bar=false",
]


# The short reference runs: 8 steps, a checkpoint every 4 (tests/conftest.py's ``runs`` fixture).
RUN = [*TINY, "--steps=8", "--save_freq=4", "--log_samples=true"]

# layout -> (processes, flags) of those runs: what a run of another kind (two nodes, a fault
# survived under torchrun's restarts) must end bit-identical to. The first three are the
# session fixture's; the 4-process DDP and FSDP are bin/bench-recovery's two-node rows.
LAYOUTS: dict[str, tuple[int, list[str]]] = {
    "ddp": (2, []),
    "fsdp": (2, ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors_dcp"]),
    "hsdp": (
        4,
        ["--batch_size=4", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--checkpoint_format=dcp"],
    ),
    "ddp4": (4, ["--batch_size=4"]),
    "fsdp4": (4, ["--batch_size=4", "--parallelism.dp_shard=4", "--checkpoint_format=dcp"]),
}
FIXTURE_LAYOUTS = ("ddp", "fsdp", "hsdp")


def train_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every launch of ckpt-train gets (this checkout, one BLAS thread, no env override)."""
    env = launch_env()
    env.pop("LEROBOT_ALLOW_ACCELERATE_ENV", None)
    env.update(extra or {})
    return env


def train(
    *args: str, nproc: int = 1, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ckpt-train; nproc > 1 goes through a real ``torchrun --standalone``."""
    return subprocess.run(
        train_command(args, nproc), env=train_env(env), capture_output=True, text=True, timeout=timeout
    )


def train_command(args: Sequence[str], nproc: int = 1, entry: str = "ckpt-train", max_restarts: int = 0) -> list[str]:
    """``ckpt-train ARGS`` (or another console script ``entry``), under ``torchrun --standalone`` when ``nproc`` > 1."""
    program = script(entry)
    if nproc > 1:
        return torchrun_command(program, args, nproc, max_restarts)
    refuse_if_in_process_only(program)
    return [program, *args]


def train_multinode(
    *args: str,
    nnodes: int = 2,
    nproc_per_node: int = 2,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    wrappers: dict[int, list[str]] | None = None,
) -> list[subprocess.CompletedProcess[str]]:
    """Run ckpt-train as ``nnodes`` torchrun agents on loopback (one per "node"); one result per agent.

    ``wrappers``: node -> a command line that runs that node's agent (its arguments appended),
    to give one "machine" something of its own, such as a private mount.
    """
    commands = multinode_torchrun_commands(script("ckpt-train"), args, nnodes, nproc_per_node, free_port())
    for node, wrapper in (wrappers or {}).items():
        commands[node] = [*wrapper, *commands[node]]
    agents = [
        subprocess.Popen(cmd, env=train_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cmd in commands
    ]
    results = []
    deadline = time.monotonic() + timeout
    try:
        for cmd, agent in zip(commands, agents, strict=True):
            out, err = agent.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append(subprocess.CompletedProcess(cmd, agent.returncode, out, err))
    finally:
        for agent in agents:
            if agent.poll() is None:
                kill_tree(agent.pid)
    return results


def start_train(args: Sequence[str], nproc: int = 1, max_restarts: int = 0, **popen: Any) -> subprocess.Popen[Any]:
    """Start ckpt-train without waiting (for tests that signal or kill it mid-run)."""
    command = train_command(args, nproc, max_restarts=max_restarts)
    return subprocess.Popen(command, env=train_env(popen.pop("env", None)), **popen)


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    )
    return proc


def _records(output_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def metrics(output_dir: Path) -> list[dict[str, Any]]:
    """The logged training steps (not the checkpoint / first-step events)."""
    return [r for r in _records(output_dir) if "event" not in r]


def events(output_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in _records(output_dir) if r.get("event") == kind]


def losses(output_dir: Path) -> list[float]:
    return [m["loss"] for m in metrics(output_dir)]


def step_dir(output_dir: Path, step: int) -> Path:
    return output_dir / "checkpoints" / f"{step:06d}"


def gathered_weights(output_dir: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(step_dir(output_dir, step) / "pretrained_model" / "model.safetensors"))


def dcp_to_dict(dcp_dir: Path, tmp: Path) -> dict[str, Any]:
    """torch's own reading of a DCP dir (the reference the tools are compared with)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{dcp_dir.parent.parent.name}-{dcp_dir.name}.pt"
    dcp_to_torch_save(dcp_dir, out)
    return torch.load(out, weights_only=False)


def flat_optimizer_by_name(step: Path) -> dict[str, torch.Tensor]:
    """A flat ``optimizer_state.safetensors`` as ``state.<name>.<slot>`` (positions mapped by its names metadata)."""
    from safetensors import safe_open

    from ckpt_tools.format.param_groups import position_names, split_flat_key

    path = step / "training_state" / "optimizer_state.safetensors"
    with safe_open(str(path), "pt") as f:
        names = position_names(f.metadata() or {}, path)
        out = {}
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            name, slot = split_flat_key(key, names)
            out[f"state.{name}.{slot}"] = f.get_tensor(key)
    return out


def dcp_optimizer_by_name(dcp_dir: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """A DCP ``optimizer_0/`` as ``state.<name>.<slot>``, comparable with :func:`flat_optimizer_by_name`."""
    osd = dcp_to_dict(dcp_dir, tmp)["optimizer"]
    return {f"state.{name}.{k}": v for name, slots in osd["state"].items() for k, v in slots.items()}


def assert_tensors_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    import torch

    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), f"{key} differs"


def flat_tree(tree: dict[str, Any], prefix: str = "") -> dict[str, torch.Tensor]:
    """Every leaf of a nested state dict by its dotted path: tensors as they are, other values by repr."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_tree(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, torch.Tensor) else torch.tensor(list(repr(value).encode()))
    return out


# What a resumed run must reproduce bit for bit: weights, optimizer, scheduler and each rank's
# torch generator (the Python/NumPy states of the main process are written for LeRobot's reader
# and may be drawn from by a background writer's libraries).
_SAME_FILES = ("pretrained_model/model.safetensors", "training_state/optimizer_state.safetensors")
_SAME_DCP = ("pretrained_model/pytorch_model_fsdp_0", "training_state/optimizer_0")
_SAME_JSON = ("training_state/scheduler_state.json",)


def unstamped_json(path: Path) -> Any:
    """A JSON record the trainer wrote, without the id of the save that wrote it (which differs per save)."""
    from ckpt_tools.format.rules.save_stamps import KEY

    doc = json.loads(path.read_text())
    return {k: v for k, v in doc.items() if k != KEY} if isinstance(doc, dict) else doc


def state_differences(step: Path, reference: Path, tmp: Path) -> list[str]:
    """Where the training state saved in ``step`` differs from ``reference`` (empty: bit-identical)."""
    import torch
    from safetensors.torch import load_file

    problems: list[str] = []

    def compare(what: str, a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
        if sorted(a) != sorted(b):
            problems.append(f"{what}: keys differ ({sorted(set(a) ^ set(b))[:5]})")
            return
        bad = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
        if bad:
            problems.append(f"{what}: {len(bad)} tensors differ ({bad[:3]})")

    for rel in _SAME_FILES:
        if (step / rel).exists() or (reference / rel).exists():
            if not (step / rel).exists() or not (reference / rel).exists():
                problems.append(f"{rel}: in one checkpoint only")
                continue
            compare(rel, load_file(str(step / rel)), load_file(str(reference / rel)))
    for rel in _SAME_DCP:
        if (reference / rel).is_dir():
            if not (step / rel).is_dir():
                problems.append(f"{rel}: missing")
                continue
            mine, theirs = tmp / "mine", tmp / "reference"
            mine.mkdir(parents=True, exist_ok=True)
            theirs.mkdir(parents=True, exist_ok=True)
            compare(rel, flat_tree(dcp_to_dict(step / rel, mine)), flat_tree(dcp_to_dict(reference / rel, theirs)))
    for rel in _SAME_JSON:
        if unstamped_json(step / rel) != unstamped_json(reference / rel):
            problems.append(f"{rel} differs")
    rng = "training_state/rng_state.safetensors"
    generators = [
        {k: v for k, v in load_file(str(where / rng)).items() if k.endswith(".torch")} for where in (step, reference)
    ]
    compare(f"{rng} (per-rank torch generators)", *generators)
    return problems


def sample_log(output_dir: Path) -> dict[int, dict[int, list[int]]]:
    """rank → step → dataset indices, from ``--log_samples=true``."""
    out: dict[int, dict[int, list[int]]] = {}
    for path in sorted((output_dir / "samples").glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        out[rank] = {}
        for line in path.read_text().splitlines():
            record = json.loads(line)
            out[rank][record["step"]] = record["indices"]
    return out


# Big enough that a save takes a noticeable fraction of a second on this disk.
MEDIUM = [a for a in TINY if not a.startswith(("--policy.dim_model", "--policy.dim_feedforward"))] + [
    "--policy.dim_model=512",
    "--policy.dim_feedforward=2048",
]


def act_of_size(gb: float) -> list[str]:
    """Flags of an ACT policy of about ``gb`` GB of fp32 weights (the benchmarks' model)."""
    # dim 1024 / ff 4096: an encoder layer holds 12.6M parameters, a decoder layer 16.8M.
    layers = max(1, round(gb * 1e9 / 4 / 29.4e6))
    return [
        f"--dataset.root={FIXTURE_DATASET}",
        "--policy.type=act",
        "--policy.dim_model=1024",
        "--policy.dim_feedforward=4096",
        "--policy.n_heads=8",
        f"--policy.n_encoder_layers={layers}",
        f"--policy.n_decoder_layers={layers}",
        "--batch_size=2",
        "--log_freq=1",
        "--progress_bar=false",
        "--policy.dropout=0.0",
    ]
