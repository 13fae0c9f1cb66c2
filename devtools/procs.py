"""Run real processes for tests: the CLIs, torch-free interpreters, torchrun jobs."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NO_TORCH_DIR = Path(__file__).resolve().parent / "no_torch"
# Set (by tests/conftest.py) while a test that is not marked ``torchrun`` runs: starting a
# training job or a torchrun launch then fails, so the fast lane cannot quietly grow slow.
IN_PROCESS_ONLY_ENV = "CKPT_TESTS_IN_PROCESS_ONLY"


def no_torch_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which ``import torch`` raises ImportError."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join([str(NO_TORCH_DIR), str(REPO), out.get("PYTHONPATH", "")])
    return out


def run_cli(
    *args: str,
    no_torch: bool = False,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``ckpt-tools ARGS`` as a separate process (the installed entry point's module)."""
    base = no_torch_env(env) if no_torch else dict(os.environ if env is None else env)
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tools.cli", *args],
        env=base,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def script(name: str) -> str:
    """Absolute path of an installed console script (e.g. ckpt-train): this interpreter's first, then PATH."""
    own = Path(sysconfig.get_path("scripts")) / name
    found = str(own) if own.exists() else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed: pip install -e '.[training,dev]'")
    return found


def refuse_if_in_process_only(program: str) -> None:
    """Fail a launch of ``program`` from a test that the fast lane (``-m "not torchrun"``) would run."""
    if os.environ.get(IN_PROCESS_ONLY_ENV):
        raise RuntimeError(
            f"{os.environ[IN_PROCESS_ONLY_ENV]} starts {Path(program).name} but is not marked torchrun: "
            "add @pytest.mark.torchrun (tests/conftest.py marks the tests that name a launcher or use a fixture that does)"
        )


def torchrun_command(program: str, args: Sequence[str], nproc: int, max_restarts: int = 0) -> list[str]:
    """``torchrun --standalone --nproc-per-node=NPROC [--max-restarts=K] PROGRAM ARGS`` (through this interpreter).

    With ``max_restarts`` torchrun relaunches every worker (up to K times) when one fails, as a
    job script that relies on ``--resume=auto`` does.
    """
    refuse_if_in_process_only(program)
    restarts = [f"--max-restarts={max_restarts}"] if max_restarts else []
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *restarts]
    return [*launcher, program, *args]


def free_port() -> int:
    """A TCP port nobody listens on now, on 127.0.0.1 (for a rendezvous endpoint)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def multinode_torchrun_commands(
    program: str, args: Sequence[str], nnodes: int, nproc_per_node: int, port: int, max_restarts: int = 0
) -> list[list[str]]:
    """One ``torchrun`` agent per "node", all on this machine, meeting at a c10d rendezvous on 127.0.0.1:PORT.

    This is the multi-node launch users type on each machine (``--nnodes --node-rank
    --rdzv-backend=c10d --rdzv-endpoint``), with loopback standing in for the network.
    """
    refuse_if_in_process_only(program)
    return [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nnodes}",
            f"--node-rank={node}",
            f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=ckpt-tests",
            # Node 0 hosts the rendezvous store, as the machine named in the endpoint does; on
            # loopback every agent would otherwise claim it, and the first to bind would win.
            f"--rdzv-conf=is_host={1 if node == 0 else 0}",
            f"--max-restarts={max_restarts}",
            program,
            *args,
        ]
        for node in range(nnodes)
    ]


def launch_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a launched job: this checkout first on the path, one BLAS thread per process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def kill_tree(pid: int, sig: int = 9) -> None:
    """Send ``sig`` to a process and all its descendants at once (torchrun workers included).

    torchrun starts its workers in their own sessions, so killing its process group alone
    would leave them running.
    """
    targets = [pid, *descendants(pid)]
    for target in targets:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, sig)
