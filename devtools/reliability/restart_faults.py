"""Faults survived by themselves: one ``torchrun --max-restarts`` job, one fault, the same final state.

Each trial starts the short reference run of a layout (``devtools.training.RUN`` with the
layout's flags) with ``--resume=auto`` under ``torchrun --max-restarts=1`` - the job script a
user puts in a scheduler - on one node or as one torchrun agent per "node" on loopback, and
injects one fault while it trains:

- ``worker-kill``: SIGKILL one worker after the first checkpoint, between saves;
- ``save-kill``: SIGKILL one worker while the next save is in flight (sync or async);
- ``stall``: SIGSTOP one worker past ``--collective_timeout_s``; the others time out, and the
  stalled worker is woken only once they are gone (a wedged process that comes back too late);
- ``node-kill``: the last node's agent and its workers are SIGKILLed, then that agent is
  started again and the rendezvous re-forms.

torchrun relaunches the workers, they resume ``last`` by themselves, and the job must finish
with exit 0, every visible checkpoint sound (``crash_harness.check_last``) and the final
weights, optimizer, scheduler and generators bit-identical to the uninterrupted run of the
same flags (``reference``). The trial also times the recovery from the fault to the first
step after the resume, phase by phase (the ``first_step`` event of the relaunched workers).

Used by ``tests/reliability/test_restart_faults.py`` and ``tests/train/test_train_multinode.py``
(the CI slice) and ``bin/bench-recovery`` (the matrix, with the recovery times).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ckpt_tools.format import layout
from ckpt_tools.train.env_guard import SHARED_STORE_OFF
from devtools.procs import free_port, kill_tree, multinode_torchrun_commands, script
from devtools.reliability import crash_harness as H
from devtools.training import LAYOUTS, RUN, state_differences, step_dir, train_env

FAULTS = ("worker-kill", "save-kill", "stall", "node-kill")
FINAL_STEP = 8  # RUN's --steps; its checkpoints are 4 and 8
COLLECTIVE_TIMEOUT_S = 10.0
RESTARTABLE = {SHARED_STORE_OFF: "1"}  # what --resume=auto under --max-restarts asks a job script for


@dataclass
class RestartTrial:
    """One fault under torchrun's restarts and what came of it (a row of the fault matrix)."""

    fault: str
    layout: str
    asynchronous: bool
    seed: int
    nnodes: int = 1
    target: str = ""  # rank<N> | node<N>
    landed: str = ""  # mid-step | mid-save | after-commit | not-injected
    last_at_fault: int | None = None
    exit_code: int | None = None
    hung: bool = False
    resumed_from: list[int] = field(default_factory=list)
    redone_steps: int | None = None  # steps trained after last_at_fault and trained again
    phases_s: dict[str, float] = field(default_factory=dict)  # fault -> first step after the resume
    violations: list[str] = field(default_factory=list)

    @property
    def corrupted(self) -> bool:
        return any(marker in v for v in self.violations for marker in ("not resumable", "unhealthy", "no usable"))


def trial_args(out: Path, layout_name: str, asynchronous: bool) -> list[str]:
    """The reference run's flags, made restartable."""
    return [
        *RUN,
        *LAYOUTS[layout_name][1],
        "--resume=auto",
        f"--checkpoint_async={'true' if asynchronous else 'false'}",
        f"--collective_timeout_s={COLLECTIVE_TIMEOUT_S:g}",
        f"--output_dir={out}",
    ]


@dataclass
class Launch:
    """The torchrun agents of one job: one (``--standalone``) or one per "node" on loopback."""

    commands: list[list[str]]
    logs: Path
    name: str
    agents: list[H.Job] = field(default_factory=list)

    @classmethod
    def start(cls, args: list[str], nproc: int, nnodes: int, logs: Path, name: str) -> Launch:
        logs.mkdir(parents=True, exist_ok=True)
        if nnodes == 1:
            job = H.launch(args, nproc, logs, name, None, 1, RESTARTABLE)
            return cls([list(map(str, job.proc.args))], logs, name, [job])  # type: ignore[arg-type]
        commands = multinode_torchrun_commands(
            script("ckpt-train"), args, nnodes, nproc // nnodes, free_port(), max_restarts=1
        )
        launch = cls(commands, logs, name)
        launch.agents = [launch._agent(node) for node in range(nnodes)]
        return launch

    def _agent(self, node: int, again: str = "") -> H.Job:
        stdout, stderr = (
            self.logs / f"{self.name}-node{node}{again}.out",
            self.logs / f"{self.name}-node{node}{again}.err",
        )
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            proc = subprocess.Popen(self.commands[node], env=train_env(RESTARTABLE), stdout=out, stderr=err)
        return H.Job(proc, stdout, stderr, time.monotonic(), time.time_ns())

    def restart_node(self, node: int) -> None:
        """The node's agent comes back (a rebooted machine, or the scheduler's relaunch of it)."""
        self.agents[node] = self._agent(node, "-again")

    @property
    def main(self) -> H.Job:
        return self.agents[0]  # node 0 holds rank 0, the rank that logs

    def workers(self) -> dict[int, int]:
        return {rank: pid for agent in self.agents for rank, pid in agent.workers().items()}

    def any_ended(self) -> bool:
        return any(agent.poll() is not None for agent in self.agents)

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(agent.wait(max(1.0, deadline - time.monotonic())) for agent in self.agents)

    def exit_code(self) -> int | None:
        codes = [agent.proc.returncode for agent in self.agents]
        return None if None in codes else max(abs(code) for code in codes if code is not None)

    def out(self) -> str:
        return self.main.out()

    def err(self) -> str:
        return "".join(agent.err() for agent in self.agents)

    def kill(self) -> None:
        for agent in self.agents:
            agent.kill()


def restart_trial(
    out: Path,
    layout_name: str,
    fault: str,
    reference: Path | None,
    *,
    nnodes: int = 1,
    asynchronous: bool = False,
    seed: int = 0,
    save_kill_delay_s: float | None = None,
) -> RestartTrial:
    """One job of ``nnodes`` agents, one fault of ``fault`` kind; judged against ``reference``.

    ``worker-kill`` / ``save-kill`` / ``stall`` strike one worker (on the last node when there
    are several); ``node-kill`` kills the last node's agent with its workers and starts that
    agent again. ``save_kill_delay_s``: how long after the save became visible ``save-kill``
    strikes; by default a random moment of a typical save (which may land after its commit).
    """
    rng = random.Random(seed)
    trial = RestartTrial(fault, layout_name, asynchronous, seed, nnodes=nnodes)
    nproc = LAYOUTS[layout_name][0]
    root = out / layout.CHECKPOINTS_DIR
    args = trial_args(out, layout_name, asynchronous)
    job = Launch.start(args, nproc, nnodes, out.parent / "logs", out.name)
    try:
        deadline = time.monotonic() + H.LAUNCH_DEADLINE_S
        moment = _wait_for_moment(job, root, fault, deadline)
        workers = job.workers()
        if moment is None or job.any_ended() or len(workers) < nproc:
            trial.landed = "not-injected"
            trial.violations.append(f"the job ended before the fault (exit {job.exit_code()}): {job.err()[-1500:]}")
            return trial
        if fault == "save-kill":
            delay = save_kill_delay_s
            time.sleep(round(rng.uniform(0.0, H.typical_save_s(out, 0.05)), 4) if delay is None else delay)
        last_node = sorted(workers)[-(nproc // nnodes) :]
        rank = rng.choice(last_node if nnodes > 1 else sorted(workers))
        trial.target = f"node{nnodes - 1}" if fault == "node-kill" else f"rank{rank}"
        trial.last_at_fault = H.last_step(root)
        saving = any(layout.list_partial_dirs(root))
        old = set(job.workers().values())
        fault_at = time.time()
        if fault == "node-kill":
            kill_tree(job.agents[-1].proc.pid)
            job.agents[-1].proc.wait()
            job.restart_node(nnodes - 1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(workers[rank], signal.SIGSTOP if fault == "stall" else signal.SIGKILL)
        gone = _watch_generation(old, (workers[rank],) if fault == "stall" else (), fault == "node-kill")
        # Before the relaunched workers (seconds of imports away) touch the directory.
        trial.landed = ("mid-save" if saving else "mid-step") if fault != "save-kill" else _save_landing(root)
        trial.hung = not job.wait(H.LAUNCH_DEADLINE_S)
        trial.exit_code = job.exit_code()
        _judge(trial, out, job.out(), job.err(), nproc, reference, fault_at, gone)
    finally:
        job.kill()
    return trial


# ====================================================================== moments and watching


def _wait_for_moment(job: Launch, root: Path, fault: str, deadline: float) -> object | None:
    """After the first checkpoint; for ``save-kill``, while the next save is in flight."""
    if fault == "save-kill":
        return H.wait_for_save(job.main, root, deadline)
    while time.monotonic() < deadline and not job.any_ended():
        if H.last_step(root) is not None:
            return H.last_step(root)
        time.sleep(0.002)
    return None


def _watch_generation(old: set[int], stalled: tuple[int, ...], all_struck: bool) -> dict[str, float]:
    """Poll until every worker of the faulted generation is gone: when the first and the last went.

    The first exit of a worker that was not struck is the detection (``all_struck``: a node
    kill, where the struck workers go at once and the others notice on their own). A stalled
    worker is woken (SIGCONT) once all the others are gone - it stalled past their timeout, and
    torchrun's stop of it (SIGTERM) waits for it to run again.
    """
    seen: dict[str, float] = {}
    initial = {pid for pid in old if _alive(pid)}
    deadline = time.monotonic() + COLLECTIVE_TIMEOUT_S + H.STALL_SLACK_S
    while time.monotonic() < deadline:
        alive = {pid for pid in old if _alive(pid)}
        struck_gone = len(old) - len(initial) if all_struck else (0 if stalled else 1)
        if len(alive) < len(old) - struck_gone and "first_exit" not in seen:
            seen["first_exit"] = time.time()
        if stalled and alive <= set(stalled):
            seen.setdefault("first_exit", time.time())
            for pid in stalled:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            stalled = ()
        if not alive:
            seen["all_gone"] = time.time()
            return seen
        time.sleep(0.01)
    return seen


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _save_landing(root: Path) -> str:
    return "mid-save" if any(layout.list_partial_dirs(root)) or H.last_step(root) != FINAL_STEP else "after-commit"


# ====================================================================== the verdict


def _judge(
    trial: RestartTrial,
    out: Path,
    stdout: str,
    stderr: str,
    nproc: int,
    reference: Path | None,
    fault_at: float,
    gone: dict[str, float],
) -> None:
    root = out / layout.CHECKPOINTS_DIR
    if trial.hung:
        trial.violations.append(f"the job did not finish within {H.LAUNCH_DEADLINE_S:.0f} s of its restart")
    elif trial.exit_code != 0:
        trial.violations.append(f"the job failed after the fault (exit {trial.exit_code}): {stderr[-1500:]}")
    marker = "--resume=auto: resuming automatically from step "
    trial.resumed_from = [int(line.split(marker)[1].split()[0]) for line in stdout.splitlines() if marker in line]
    finished_at_once = "nothing to do: the run is at step" in stdout
    if trial.resumed_from != [trial.last_at_fault] and not (finished_at_once and trial.landed == "after-commit"):
        trial.violations.append(f"resumed from {trial.resumed_from}, not once from {trial.last_at_fault}")
    if H.last_step(root) != FINAL_STEP:
        trial.violations.append(f"the final checkpoint is step {H.last_step(root)}, not {FINAL_STEP}")
    trial.violations += H.check_last(root, nproc, None)
    for tb in H.worker_tracebacks(stderr):
        trial.violations.append(f"a traceback instead of one line: {tb}")
    if reference is not None and H.last_step(root) == FINAL_STEP:
        differences = state_differences(step_dir(out, FINAL_STEP), reference, out.parent / f"{out.name}-tensors")
        trial.violations += [f"not bit-identical to the uninterrupted run: {d}" for d in differences]
    _measure(trial, out, fault_at, gone)


def _measure(trial: RestartTrial, out: Path, fault_at: float, gone: dict[str, float]) -> None:
    """Fault -> detection -> stop -> restart -> start-up phases -> first step, from the run's own events."""
    path = out / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    starts = [i for i, r in enumerate(records) if r.get("event") == "first_step"]
    if len(starts) < 2 or "all_gone" not in gone:
        return
    first = records[starts[-1]]
    before = [r["step"] for r in records[: starts[-1]] if "event" not in r]
    if trial.resumed_from:
        trial.redone_steps = max(0, max(before, default=0) - trial.resumed_from[0])
    started = first.get("started_unix")
    phases = first.get("phases_s", {})
    if started is None:
        return
    times = {"first_exit": gone.get("first_exit", gone["all_gone"]), "all_gone": gone["all_gone"], "started": started}
    trial.phases_s = {
        "detection": times["first_exit"] - fault_at,
        "stop": times["all_gone"] - times["first_exit"],
        "restart": started - times["all_gone"],
        **startup_phases(phases, first["seconds_since_process_start"]),
    }
    trial.phases_s["total"] = started + first["seconds_since_process_start"] - fault_at
    trial.phases_s = {k: round(v, 3) for k, v in trial.phases_s.items()}


STARTUP_PHASES = ("imports", "process_group", "build", "load")


def startup_phases(marks: dict[str, float], first_step: float) -> dict[str, float]:
    """Durations between the start-up marks of :mod:`ckpt_tools.train.report.startup`."""
    out: dict[str, float] = {}
    previous = 0.0
    for name in STARTUP_PHASES:
        if name in marks:
            out[name] = marks[name] - previous
            previous = marks[name]
    out["first_step"] = first_step - previous
    return out
