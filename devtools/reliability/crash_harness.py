"""Crash consistency under real faults: SIGKILL and SIGTERM mid-save, a full disk, a dying rank.

Every trial runs the real ``ckpt-train`` under ``torchrun --standalone`` and injects one fault
at a moment drawn from a seeded ``random.Random``; afterwards the checkpoint directory must
still hold a complete, resumable ``last``:

- ``last`` resolves to a visible step directory, never moves backwards, and an interrupted
  save never became visible;
- ``verify_resume(last)`` (the Python API of ``ckpt-tools verify-resume``) passes and
  ``inspect_path(last)`` is healthy, and so is every other visible step directory;
- the job exited by itself within a deadline (no hang);
- a real resume runs: kill trials are *chained* - each launch after the first resumes from
  the ``last`` the previous kill left, must say ``resumed from <that step>`` and train up to
  its next save, where it is killed in turn; the chain ends with a resume that runs to
  completion. One launch therefore checks one kill's aftermath and injects the next fault.

The moment of a kill: the harness polls for the hidden ``.NNNNNN.partial`` directory of a save
that starts after the first commit (so a previous ``last`` exists), then waits a random delay
in ``[0, typical save duration]`` - the median of the durations this run logged so far -
and kills either the whole job tree or one worker picked by its ``RANK``.

Used by ``tests/reliability/`` (a few trials) and ``bin/reliability-report`` (many).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ckpt_tools.format import layout
from devtools.procs import descendants, kill_tree
from devtools.training import MEDIUM, TINY, start_train

EXIT_DEADLINE_S = 120.0  # torchrun gives survivors 30 s after SIGTERM before it SIGKILLs them
STALL_SLACK_S = 90.0  # a stopped rank: the job ends within the collective timeout plus this
LAUNCH_DEADLINE_S = 300.0  # start-up, resume and training up to the next save on 2 busy cores
CHAIN_STEPS = 99_999  # "forever", and still six-digit step directory names

# name -> (processes, flags); non-sharded runs always save the safetensors format.
CONFIGS: dict[str, tuple[int, list[str]]] = {
    "ddp": (2, []),
    "fsdp-safetensors": (2, ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors"]),
    "fsdp-dcp": (2, ["--parallelism.dp_shard=2", "--checkpoint_format=dcp"]),
    "fsdp-safetensors_dcp": (2, ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors_dcp"]),
    "hsdp-dcp": (4, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--checkpoint_format=dcp"]),
}


# ====================================================================== processes


@dataclass
class Job:
    """One torchrun launch, its logs on disk (pipes could fill up and stall the job)."""

    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    started: float
    started_ns: int

    def poll(self) -> int | None:
        return self.proc.poll()

    def out(self) -> str:
        return self.stdout.read_text(errors="replace") if self.stdout.exists() else ""

    def err(self) -> str:
        return self.stderr.read_text(errors="replace") if self.stderr.exists() else ""

    def workers(self) -> dict[int, int]:
        """RANK -> pid of the live ckpt-train workers under this torchrun."""
        out = {}
        for pid in descendants(self.proc.pid):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"ckpt-train" not in cmdline:
                continue
            for item in environ:
                if item.startswith(b"RANK="):
                    out[int(item[5:])] = pid
        return out

    def wait(self, timeout: float) -> bool:
        """True when the job exited by itself within ``timeout``; otherwise it is killed."""
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            kill_tree(self.proc.pid)
            self.proc.wait()
            return False

    def kill(self) -> None:
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
            self.proc.wait()


def launch(
    args: list[str],
    nproc: int,
    logs: Path,
    name: str,
    preexec: Any = None,
    max_restarts: int = 0,
    env: dict[str, str] | None = None,
) -> Job:
    logs.mkdir(parents=True, exist_ok=True)
    stdout, stderr = logs / f"{name}.out", logs / f"{name}.err"
    with open(stdout, "wb") as out, open(stderr, "wb") as err:  # every config is multi-process: torchrun
        proc = start_train(args, nproc, max_restarts, stdout=out, stderr=err, preexec_fn=preexec, env=env)
    return Job(proc, stdout, stderr, time.monotonic(), time.time_ns())


def run_args(
    out: Path, config: str, asynchronous: bool, model: list[str] = MEDIUM, steps: int = CHAIN_STEPS
) -> list[str]:
    return [
        *model,
        f"--steps={steps}",
        "--save_freq=2",
        f"--checkpoint_async={'true' if asynchronous else 'false'}",
        f"--output_dir={out}",
        *CONFIGS[config][1],
    ]


def resume_args(root: Path, *extra: str) -> list[str]:
    return ["--resume=true", f"--config_path={root / layout.LAST_LINK}", *extra]


# ====================================================================== the checkpoint directory


def last_step(root: Path) -> int | None:
    target = layout.resolve_last(root)
    return int(target.name) if target is not None and layout.is_step_dir_name(target.name) else None


def partial_step(path: Path) -> int | None:
    name = path.name.removeprefix(layout.PARTIAL_PREFIX).removesuffix(layout.PARTIAL_SUFFIX)
    return int(name) if name.isdigit() else None


def wait_for_save(job: Job, root: Path, deadline: float) -> tuple[Path, int] | None:
    """A save that started in this launch after ``last`` existed: its partial dir and step."""
    while time.monotonic() < deadline and job.poll() is None:
        last = last_step(root)
        if last is not None:
            for partial in layout.list_partial_dirs(root):
                step = partial_step(partial)
                try:
                    fresh = partial.stat().st_ctime_ns >= job.started_ns
                except FileNotFoundError:
                    continue
                if step is not None and step > last and fresh:
                    return partial, step
        time.sleep(0.002)
    return None


def typical_save_s(out: Path, default: float = 1.0) -> float:
    """Median duration of the saves this run logged: the loop's pause plus the background write."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return default
    pauses: dict[int, float] = {}
    writes: dict[str, float] = {}
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("event") == "checkpoint":
                pauses[record["step"]] = record["pause_s"]
            elif record.get("event") == "checkpoint_committed":
                writes[Path(record["path"]).name] = record["write_s"]
    durations = [p + writes.get(f"{s:06d}", 0.0) for s, p in pauses.items()]
    return statistics.median(durations[-8:]) if durations else default


def prune(root: Path, keep: int = 2) -> None:
    """Drop old complete checkpoints between launches (disk space); never ``last`` or newer ones."""
    last = last_step(root)
    steps = [p for p in layout.list_step_dirs(root) if last is not None and int(p.name) < last]
    for old in steps[: max(0, len(steps) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def check_last(root: Path, nproc: int, previous: int | None) -> list[str]:
    """What must hold after any fault: a complete, resumable ``last``, no broken visible step."""
    from ckpt_tools.inspect import inspect_path
    from ckpt_tools.resume.target import TargetRequest
    from ckpt_tools.resume.verify import verify_resume

    problems = []
    link = root / layout.LAST_LINK
    target = layout.resolve_last(root)
    if target is None:
        return [f"no usable {layout.LAST_LINK} ({'dangling' if link.is_symlink() else 'missing'})"]
    if target.parent != root.resolve() or not layout.is_step_dir_name(target.name):
        problems.append(f"last points at {target}, not a step directory of {root}")
    step = int(target.name)
    if previous is not None and step < previous:
        problems.append(f"last moved backwards: {previous} -> {step}")
    for visible in layout.list_step_dirs(root):
        # Whether its files resume: an older step's resume into its own run, which holds newer
        # ones, needs --overwrite_checkpoints=true (the trainer refuses it otherwise).
        report = verify_resume(visible, TargetRequest(nproc=nproc, overwrite_checkpoints=True))
        if not report.resumable:
            why = "; ".join(c.message for c in report.failures)[:500]
            problems.append(f"{visible.name} is visible but not resumable: {why}")
        health = inspect_path(visible)
        if not health.healthy:
            problems.append(f"{visible.name} is visible but inspect calls it unhealthy")
    return problems


# ====================================================================== trials


@dataclass
class Trial:
    """One injected fault and everything observed about it (a row of the report)."""

    kind: str  # sigkill | sigterm | full-disk | rank-death
    config: str
    asynchronous: bool
    seed: int
    index: int
    target: str = ""  # job | rank<N> | torchrun
    delay_s: float = 0.0
    save_step: int | None = None  # the save the fault hit (None: not during a save)
    landed: str = ""  # mid-save | after-commit | no-save | not-injected
    exit_code: int | None = None
    exit_s: float | None = None  # from the fault to the job's exit
    hung: bool = False
    last_before: int | None = None
    last_after: int | None = None
    resumed: bool | None = None  # the next launch resumed from last_after and trained on
    error_lines: list[str] = field(default_factory=list)  # the job's one-line "error: " reports
    violations: list[str] = field(default_factory=list)

    @property
    def injected(self) -> bool:
        return self.landed not in ("", "not-injected")

    @property
    def data_lost(self) -> bool:
        """``last`` missing, moved backwards, or a visible checkpoint that is broken."""
        lost = ("no usable", "no last", "last moved", "last points", "not resumable", "unhealthy")
        return any(marker in v for v in self.violations for marker in lost)


@dataclass
class Chain:
    """Successive launches in one output dir: start, then (fault, resume) again and again."""

    out: Path
    config: str
    asynchronous: bool
    seed: int
    model: list[str] = field(default_factory=lambda: list(MEDIUM))
    trials: list[Trial] = field(default_factory=list)
    launches: int = 0
    logs: Path | None = None  # default: <out>/logs (a full-disk trial keeps them off the full disk)

    @property
    def root(self) -> Path:
        return self.out / layout.CHECKPOINTS_DIR

    @property
    def nproc(self) -> int:
        return CONFIGS[self.config][0]

    def start(self, *extra: str, steps: int = CHAIN_STEPS, preexec: Any = None) -> Job:
        """A fresh run on the first call; afterwards a resume from ``last`` (``extra`` flags on top)."""
        self.launches += 1
        name = f"launch{self.launches:03d}"
        if self.launches == 1:
            args = [*run_args(self.out, self.config, self.asynchronous, self.model, steps), *extra]
        else:
            args = resume_args(self.root, *extra)
        return launch(args, self.nproc, self.logs or self.out / "logs", name, preexec)

    def resumed_ok(self, job: Job, expected: int | None) -> bool:
        """The launch said it resumed from ``expected`` (and the caller saw it reach a later save)."""
        if expected is None:
            return False
        wanted = f"resumed from {self.root.resolve() / layout.step_dir_name(expected)} at step {expected}"
        return wanted in job.out()


def kill_trials(chain: Chain, count: int, signal_kind: str = "sigkill") -> Iterator[Trial]:
    """``count`` chained faults: SIGKILL (or SIGTERM) at a random moment of a save, then resume."""
    rng = random.Random(chain.seed)
    previous_job: Job | None = None
    previous_last: int | None = None
    for index in range(count):
        job = chain.start()
        trial = Trial(signal_kind, chain.config, chain.asynchronous, chain.seed, index)
        found = wait_for_save(job, chain.root, time.monotonic() + LAUNCH_DEADLINE_S)
        if previous_job is not None and chain.trials:
            chain.trials[-1].resumed = found is not None and chain.resumed_ok(job, previous_last)
            if not chain.trials[-1].resumed:
                chain.trials[-1].violations.append(f"the next launch did not resume from {previous_last} and train on")
        if found is None:
            trial.landed = "not-injected"
            trial.violations.append(f"no save started (exit {job.poll()}): {job.err()[-1500:]}")
            job.kill()
            chain.trials.append(trial)
            yield trial
            return
        partial, trial.save_step = found
        trial.delay_s = round(rng.uniform(0.0, typical_save_s(chain.out)), 4)
        targets = (
            ["job", *(f"rank{r}" for r in range(chain.nproc))] if signal_kind == "sigkill" else ["torchrun", "job"]
        )
        trial.target = rng.choice(targets)
        time.sleep(trial.delay_s)
        trial.last_before = last_step(chain.root)
        fault_at = time.monotonic()
        saving_at_signal = partial.exists()
        _send(job, trial.target, signal.SIGKILL if signal_kind == "sigkill" else signal.SIGTERM)
        exited = job.wait(EXIT_DEADLINE_S)
        trial.exit_s = round(time.monotonic() - fault_at, 3)
        trial.exit_code = job.proc.returncode
        trial.hung = not exited
        if trial.hung:
            trial.violations.append(f"the job did not exit within {EXIT_DEADLINE_S:.0f} s of the fault")
        # SIGKILL: the save was cut off if its partial dir is still there. SIGTERM: the save
        # was running when the signal came (it is then finished before the job stops).
        cut_off = partial.exists() if signal_kind == "sigkill" else saving_at_signal
        trial.landed = "mid-save" if cut_off else "after-commit"
        trial.last_after = last_step(chain.root)
        trial.violations += check_last(chain.root, chain.nproc, trial.last_before)
        if signal_kind == "sigterm":
            trial.violations += _graceful_stop_problems(job, chain.root)
        chain.trials.append(trial)
        previous_job, previous_last = job, trial.last_after
        prune(chain.root)
        yield trial


def finish_chain(chain: Chain) -> Trial | None:
    """The final resume: from ``last`` up to two more steps, to a clean exit and a new ``last``."""
    last = last_step(chain.root)
    if last is None:
        return None
    job = chain.start(f"--steps={last + 2}")
    exited = job.wait(LAUNCH_DEADLINE_S)
    trial = chain.trials[-1] if chain.trials else None
    ok = exited and job.proc.returncode == 0 and chain.resumed_ok(job, last) and last_step(chain.root) == last + 2
    if trial is not None:
        trial.resumed = ok
        if not ok:
            trial.violations.append(
                f"the final resume from {last} failed (exit {job.proc.returncode}): {job.err()[-1500:]}"
            )
        else:
            trial.violations += check_last(chain.root, chain.nproc, last)
    return trial


def _send(job: Job, target: str, sig: int) -> None:
    if target == "job":
        kill_tree(job.proc.pid, sig)
    elif target == "torchrun":
        with contextlib.suppress(ProcessLookupError):
            os.kill(job.proc.pid, sig)
    else:
        pid = job.workers().get(int(target.removeprefix("rank")))
        if pid is None:  # already gone: the fault lands on the job instead
            kill_tree(job.proc.pid, sig)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def _graceful_stop_problems(job: Job, root: Path) -> list[str]:
    """SIGTERM: the ranks agree on a step, finish the in-flight save, and say so in one line."""
    err = job.err()
    problems = []
    if "stopped by SIGTERM after step" not in err and job.proc.returncode != 0:
        problems.append(f"SIGTERM did not stop the run gracefully (exit {job.proc.returncode}): {err[-800:]}")
    for tb in worker_tracebacks(err):
        problems.append(f"SIGTERM produced a traceback: {tb}")
    last = last_step(root)
    stale = [p for p in layout.list_partial_dirs(root) if (partial_step(p) or 0) > (last or 0)]
    if stale:
        problems.append(f"SIGTERM left an unfinished save behind: {[p.name for p in stale]}")
    return problems


# ====================================================================== a dying rank (no save involved)


def rank_death_trial(
    out: Path,
    config: str,
    seed: int,
    asynchronous: bool = False,
    *,
    resume: bool = True,
    stall: bool = False,
    collective_timeout_s: float | None = None,
) -> Trial:
    """Kill one worker (not torchrun) at a random moment of training: the others sit in a
    collective waiting for it. The job must end by itself, and ``last`` stay resumable (a
    resume runs when ``resume``).

    ``stall``: SIGSTOP the worker instead - alive but absent, as a wedged process or a lost
    node looks. No launcher notices that; only the process group's collective timeout ends
    the job (``--collective_timeout_s``, default 600 s), so the deadline is that timeout plus
    slack.
    """
    rng = random.Random(seed)
    chain = Chain(out, config, asynchronous, seed)
    trial = Trial("rank-death", config, asynchronous, seed, 0)
    extra = [] if collective_timeout_s is None else [f"--collective_timeout_s={collective_timeout_s}"]
    job = chain.start(*extra)
    deadline = time.monotonic() + LAUNCH_DEADLINE_S
    while last_step(chain.root) is None and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.01)
    trial.last_before = last_step(chain.root)
    if trial.last_before is None:
        trial.landed = "not-injected"
        trial.violations.append(f"no first checkpoint (exit {job.poll()}): {job.err()[-1500:]}")
        job.kill()
        return trial
    trial.delay_s = round(rng.uniform(0.0, 3.0), 3)
    trial.target = f"rank{rng.randrange(chain.nproc)}"
    if stall:
        trial.kind = "rank-stall"
    time.sleep(trial.delay_s)
    trial.last_before = last_step(chain.root)
    fault_at = time.monotonic()
    partials = {p.name for p in layout.list_partial_dirs(chain.root)}
    _send(job, trial.target, signal.SIGSTOP if stall else signal.SIGKILL)
    timeout = 600.0 if collective_timeout_s is None else collective_timeout_s
    deadline = timeout + STALL_SLACK_S if stall else EXIT_DEADLINE_S
    trial.hung = not job.wait(deadline)
    trial.exit_s = round(time.monotonic() - fault_at, 3)
    trial.exit_code = job.proc.returncode
    trial.landed = "mid-save" if partials else "no-save"
    trial.error_lines = [line for line in job.err().splitlines() if line.startswith("error: ")]
    for tb in worker_tracebacks(job.err()):
        trial.violations.append(f"the {trial.kind} produced a traceback: {tb}")
    if trial.hung:
        trial.violations.append(f"the job did not exit within {deadline:.0f} s of the rank's {trial.kind}")
    elif trial.exit_code == 0:
        trial.violations.append("the job exited 0 although a rank died")
    trial.last_after = last_step(chain.root)
    trial.violations += check_last(chain.root, chain.nproc, trial.last_before)
    if resume and trial.last_after is not None:
        chain.trials.append(trial)
        finish_chain(chain)
    return trial


# ====================================================================== a full disk


def tmpfs_available() -> bool:
    """Root and a working ``mount -t tmpfs``: a real size-limited filesystem for the trial."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    probe = Path(f"/tmp/ckpt-tmpfs-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)], capture_output=True)
        if ok.returncode != 0:
            return False
        subprocess.run(["umount", str(probe)], capture_output=True)
        return True
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


@contextlib.contextmanager
def tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _used_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def full_disk_trial(work: Path, config: str, seed: int, asynchronous: bool = False, method: str = "auto") -> Trial:
    """The disk fills up while the run trains: the next save must fail with one clear line,
    commit nothing, and leave ``last`` at the previous complete checkpoint (which still resumes).

    ``tmpfs`` (root): the run trains on a tmpfs; once its first checkpoint is committed the
    filesystem is shrunk (``mount -o remount,size=``) to what is used plus a little, so the
    next save runs out of space part-way. ``fsize`` (no root): a first run saves a checkpoint;
    a resume then runs with ``RLIMIT_FSIZE`` below the size of its largest file, so its first
    save fails the same way (EFBIG instead of ENOSPC).
    """
    rng = random.Random(seed)
    if method == "auto":
        method = "tmpfs" if tmpfs_available() else "fsize"
    trial = Trial("full-disk", config, asynchronous, seed, 0, target=method)
    margin = rng.choice([0, 64 * 1024, 512 * 1024])
    trial.delay_s = margin / 2**20  # recorded: the free space left, in MiB
    if method == "tmpfs":
        mount = work / "disk"
        with tmpfs(mount, 2 * 2**30):
            chain = Chain(mount / "run", config, asynchronous, seed, model=list(TINY), logs=work / "logs")
            job = chain.start()
            deadline = time.monotonic() + LAUNCH_DEADLINE_S
            while last_step(chain.root) is None and time.monotonic() < deadline and job.poll() is None:
                time.sleep(0.01)
            used = _used_bytes(mount)
            subprocess.run(["mount", "-o", f"remount,size={used + margin}", str(mount)], check=True)
            trial.last_before = last_step(chain.root)  # complete when the disk filled up
            _judge_full_disk(trial, job, chain)
            if trial.last_after is not None:  # resume on a disk with room: the checkpoint is sound
                safe = work / "copy"
                shutil.copytree(chain.out, safe, symlinks=True)
                trial.resumed = _resume_elsewhere(safe, chain, trial)
        return trial
    chain = Chain(work / "run", config, asynchronous, seed, model=list(TINY))
    first = chain.start(steps=2)
    if not first.wait(LAUNCH_DEADLINE_S) or first.proc.returncode != 0:
        trial.violations.append(f"the first run failed: {first.err()[-1500:]}")
        return trial
    trial.last_before = last_step(chain.root)
    biggest = max(p.stat().st_size for p in layout.resolve_last(chain.root).rglob("*") if p.is_file())  # type: ignore[union-attr]
    limit = max(4096, biggest // 2 + margin)

    def cap() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    job = chain.start(f"--steps={CHAIN_STEPS}", preexec=cap)  # a resume of the first run
    _judge_full_disk(trial, job, chain)
    trial.resumed = _resume_elsewhere(chain.out, chain, trial)
    return trial


def _judge_full_disk(trial: Trial, job: Job, chain: Chain) -> None:
    trial.hung = not job.wait(LAUNCH_DEADLINE_S)
    trial.exit_code = job.proc.returncode
    trial.last_after = last_step(chain.root)
    partials = layout.list_partial_dirs(chain.root)
    trial.save_step = max((partial_step(p) or 0 for p in partials), default=None)
    trial.landed = "mid-save" if partials else "no-save"
    err = job.err()
    if trial.hung:
        trial.violations.append("the run did not stop after its disk filled up")
    elif trial.exit_code == 0:
        trial.violations.append("the run exited 0 although a save could not be written")
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    trial.error_lines = errors
    # One line per rank that hit the disk itself (each writes its own files), naming the cause.
    named = [line for line in errors if any(cause in line for cause in DISK_FULL_WORDS)]
    if not named or len(named) != len(errors) or len(errors) > chain.nproc:
        trial.violations.append(f"full disk: the error lines do not name the full disk once per rank: {errors[:5]}")
    for tb in worker_tracebacks(err):
        trial.violations.append(f"full disk: a traceback instead of one clear line: {tb}")
    if trial.last_after is None:
        trial.violations.append("no last after the disk filled up")
    trial.violations += check_last(chain.root, chain.nproc, trial.last_before)


def _resume_elsewhere(out: Path, chain: Chain, trial: Trial) -> bool:
    root = out / layout.CHECKPOINTS_DIR
    last = last_step(root)
    if last is None:
        return False
    job = launch(
        ["--resume=true", f"--config_path={root / layout.LAST_LINK}", f"--output_dir={out}", f"--steps={last + 2}"],
        chain.nproc,
        out / "logs",
        "resume-after-full-disk",
    )
    ok = job.wait(LAUNCH_DEADLINE_S) and job.proc.returncode == 0 and last_step(root) == last + 2
    if not ok:
        trial.violations.append(f"resume after the full disk failed: {job.err()[-1500:]}")
    return ok


LAUNCHER_EXCEPTIONS = ("SignalException", "ChildFailedError")
DISK_FULL_WORDS = ("no space left on device", "file too large")


def worker_tracebacks(err: str) -> list[str]:
    """The exception lines of the tracebacks the training processes printed (each once).

    torchrun's own agent prints one when it is signalled (``SignalException``) or when a worker
    failed (``ChildFailedError``): that is the launcher's behaviour, not ours, and is left out.
    """
    lines = [re.sub(r"^\[(?:rank|default)\d+\]: ?", "", line) for line in err.splitlines()]
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("Traceback (most recent call last):"):
            i += 1
            continue
        i += 1
        while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
            i += 1
        last = lines[i].strip() if i < len(lines) else "(cut off)"
        if not any(name in last for name in LAUNCHER_EXCEPTIONS) and last[:300] not in out:
            out.append(last[:300])
    return out


def open_log(path: Path) -> IO[str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a", buffering=1)
