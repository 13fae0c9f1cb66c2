"""Run every checkpoint reader on one damaged checkpoint, fenced in, and judge what happened.

A *case* is: a fresh copy of a real checkpoint inside an *arena* directory, one mutation from
:mod:`devtools.reliability.fuzz_mutations`, then every reader - ``inspect``, ``verify-resume``,
``reshard-plan``, ``push`` (its reading and validation stage, up to the network),
``convert-dcp`` (model, optimizer, and ``--delete-dcp --allow-unresumable``: the output goes
outside the step, which the deletion rule refuses without that flag) - run on it through
the Python API in a forked child whose address space is capped (``RLIMIT_AS``) and whose
wall time is bounded. The parent then checks the rules of docs/reliability.md:

- every reader returned, or raised a :class:`~ckpt_tools.errors.CkptError` with a one-line
  message; anything else is a *bug* (what the CLI would show as a traceback);
- no child ran out of its memory cap, none hung (killed at the deadline), none crashed;
- the sentinel file that every code-running payload aims at does not exist;
- the process-wide objects a pickle could reach (the allowlists' stand-ins, ``pathlib``'s
  classes, the dtype tables: :mod:`devtools.reliability.process_state`) are unchanged after
  the readers ran - else the case counts as a *mutated process*;
- nothing in the arena changed except the conversion output directories (and the DCP
  directory that a *successful* ``--delete-dcp`` removes); a failed conversion left no output;
- readers that can never succeed on this damage did not (``Mutation.must_fail``);
- a conversion of a model DCP directory the mutation did not touch is byte-identical to the
  conversion of the pristine checkpoint.

The same arena also feeds the real CLI processes (:func:`run_cli_case`) and the training
core's resume (:func:`run_train_case`) for the sampled cases.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.procs import REPO, no_torch_env
from devtools.reliability.fuzz_mutations import (
    CONVERT_DELETE,
    CONVERT_MODEL,
    CONVERT_OPTIMIZER,
    FAMILIES,
    INSPECT,
    MODEL_DCP,
    PLAN,
    PUSH,
    VERIFY,
    Arena,
    Family,
    Mutation,
)
from devtools.training import train_command, train_env

MEMORY_CAP = 2 * 2**30  # bytes of address space a reader may add on top of the process's own
READERS = (INSPECT, VERIFY, PLAN, PUSH, CONVERT_MODEL, CONVERT_OPTIMIZER, CONVERT_DELETE)
TARGET_FORMS = ("root", "step", "step", "pretrained_model", "model_dcp", "training_state")
DOCUMENTED_EXIT_CODES = {0, 1, 2, 3, 4, 5}
# All readers on a small .metadata built to cost far more than its size: seconds, not the deadline.
WORK_BOMB_SECONDS = 20.0
PUBLISHING_FORMS = ("root", "step", "pretrained_model")  # target forms whose push reads pretrained_model/
# The CLI's push must never reach a network: offline mode stops it right after its reading and
# validation stage (exit 5), and the endpoint is a closed loopback port should that ever change.
NO_NETWORK_ENV = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}


# ====================================================================== seeds and arenas


@dataclass(frozen=True)
class Seed:
    """A pristine checkpoint step to copy from, and what converting it gives (for comparisons)."""

    name: str
    step_dir: Path
    reference: dict[str, dict[str, str]]  # reader → output file name → sha256 (pristine conversion)


def make_seed(name: str, step_dir: Path, scratch: Path) -> Seed:
    """Convert a pristine copy once; its outputs are what an untouched DCP dir must convert to."""
    from ckpt_tools.convert import convert_dcp

    arena = new_arena(scratch / f"seed-{name}", step_dir)
    reference: dict[str, dict[str, str]] = {}
    for reader, what in ((CONVERT_MODEL, "model"), (CONVERT_OPTIMIZER, "optimizer")):
        out = arena.out / reader
        try:
            convert_dcp(arena.step, what=what, output=out, progress=False)
        except Exception:  # a seed without that DCP dir has no reference
            continue
        reference[reader] = {p.name: _sha256(p) for p in sorted(out.iterdir())}
    shutil.rmtree(arena.root)
    return Seed(name, step_dir, reference)


def new_arena(root: Path, step_dir: Path) -> Arena:
    arena = Arena(root)
    arena.checkpoints.mkdir(parents=True)
    shutil.copytree(step_dir, arena.step, symlinks=True)
    os.symlink(arena.step.name, arena.checkpoints / "last")
    arena.outside.mkdir()
    arena.secret.write_bytes(b"not a checkpoint: a file outside it\n")
    arena.out.mkdir()
    return arena


def target_path(arena: Arena, form: str) -> Path:
    return {
        "root": arena.checkpoints,
        "step": arena.step,
        "pretrained_model": arena.step / "pretrained_model",
        "model_dcp": arena.step / MODEL_DCP,
        "training_state": arena.step / "training_state",
    }[form]


# ====================================================================== snapshots


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: directories, symlinks (by target), FIFOs, files (by sha256)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link:" + os.readlink(path)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            elif stat.S_ISREG(st.st_mode):
                out[rel] = _sha256(path)
            else:
                out[rel] = f"special:{stat.S_IFMT(st.st_mode):o}"
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ====================================================================== the fenced child


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fenced(fn: Any, timeout: float, memory_cap: int = MEMORY_CAP) -> dict[str, Any]:
    """Run ``fn()`` (returning JSON-able data) in a forked child with capped memory and a deadline.

    Returns ``{"status": "done", "value": ..., "rss_growth_kib": N}``, or status ``timeout``
    (killed at the deadline: a hang) or ``crash`` (died without answering: a signal, the
    kernel's OOM killer, an abort in C code).
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into the caller's frames
        os.close(read_fd)
        code = 0
        try:
            cap = _vm_size() + memory_cap
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            start_rss = _rss_kib()
            value = fn()
            growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start_rss
            payload = json.dumps({"status": "done", "value": value, "rss_growth_kib": max(0, growth)}).encode()
            with os.fdopen(write_fd, "wb") as f:
                f.write(payload)
        except BaseException:  # anything here is reported as a crash
            code = 70
        os._exit(code)
    os.close(write_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    status = None
    with os.fdopen(read_fd, "rb") as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            ready, _, _ = select.select([f], [], [], left)
            if not ready:
                continue
            data = os.read(f.fileno(), 1 << 16)
            if not data:
                break
            chunks.append(data)
    if status == "timeout":
        os.kill(pid, signal.SIGKILL)
    _, wait_status = os.waitpid(pid, 0)
    if status == "timeout":
        return {"status": "timeout"}
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return {"status": "crash", "wait_status": wait_status}


# ====================================================================== readers (run in the child)


def _call(fn: Any) -> dict[str, Any]:
    from ckpt_tools.errors import CkptError

    try:
        result = fn()
        json.dumps(result, default=str)  # what --json prints must serialise
        return {"status": "ok", "result": result}
    except CkptError as e:
        message = str(e)
        status = "error" if message and "\n" not in message.strip() else "bug"
        return {"status": status, "type": type(e).__name__, "message": message[:500], "code": int(e.exit_code)}
    except MemoryError:
        return {"status": "memory", "type": "MemoryError", "trace": traceback.format_exc()[-3000:]}
    except BaseException as e:  # exactly what the rules forbid: report it
        return {
            "status": "bug",
            "type": type(e).__name__,
            "message": str(e)[:300],
            "trace": traceback.format_exc()[-3000:],
        }


def run_readers_watched(target: Path, arena: Arena, nproc: int) -> dict[str, Any]:
    """:func:`run_readers`, and what they changed in the process's shared objects (in the fenced child)."""
    from devtools.reliability import process_state

    before = process_state.fingerprint()
    started = time.monotonic()
    readers = run_readers(target, arena, nproc)
    elapsed = time.monotonic() - started
    return {
        "readers": readers,
        "process_changes": process_state.changes(before, process_state.fingerprint()),
        "elapsed_s": round(elapsed, 3),
    }


def run_readers(target: Path, arena: Arena, nproc: int) -> dict[str, dict[str, Any]]:
    """Every reader on ``target`` (in the fenced child); the deleting conversion last."""
    from ckpt_tools.convert import convert_dcp
    from ckpt_tools.hub.push import prepare_push
    from ckpt_tools.inspect import inspect_path
    from ckpt_tools.resume.plan import plan_reshard
    from ckpt_tools.resume.target import TargetRequest
    from ckpt_tools.resume.verify import verify_resume

    def inspect() -> dict[str, Any]:
        r = inspect_path(target, tensors=True)
        return {"healthy": r.healthy, "doc": json.loads(json.dumps(r.to_dict(), default=str))["kind"]}

    def verify() -> dict[str, Any]:
        r = verify_resume(target)
        return {"resumable": r.resumable, "failed": [c.message[:200] for c in r.failures][:3]}

    def plan() -> dict[str, Any]:
        r = plan_reshard(target, TargetRequest(nproc=nproc))
        json.dumps(r.to_dict(), default=str)
        return {"workable": r.workable}

    def push() -> dict[str, Any]:
        r = prepare_push(target, "alice/fuzz")
        return {"files": [f.name for f in r.plan.files], "card": r.card is not None}

    def convert(what: str, out: Path, delete: bool = False) -> Any:
        def run() -> dict[str, Any]:
            r = convert_dcp(target, what=what, output=out, progress=False, delete_dcp=delete, allow_unresumable=delete)
            json.dumps(r.to_dict(), default=str)
            return {"files": [str(p) for p in r.output_files], "dcp_dir": str(r.plan.dcp_dir), "deleted": r.deleted_dcp}

        return run

    return {
        INSPECT: _call(inspect),
        VERIFY: _call(verify),
        PLAN: _call(plan),
        PUSH: _call(push),
        CONVERT_MODEL: _call(convert("model", arena.out / CONVERT_MODEL)),
        CONVERT_OPTIMIZER: _call(convert("optimizer", arena.out / CONVERT_OPTIMIZER)),
        CONVERT_DELETE: _call(convert("model", arena.out / CONVERT_DELETE, delete=True)),
    }


# ====================================================================== one case


@dataclass
class CaseResult:
    seed: str
    family: str
    detail: str
    target: str
    readers: dict[str, dict[str, Any]] = field(default_factory=dict)
    child: str = "done"  # done | timeout | crash
    rss_growth_kib: int = 0
    violations: list[str] = field(default_factory=list)
    code_executed: bool = False
    process_changes: list[str] = field(default_factory=list)  # shared objects a reader's load changed
    elapsed_s: float = 0.0  # the readers' wall time, in the fenced child
    outside_writes: list[str] = field(default_factory=list)
    sources_deleted: list[str] = field(default_factory=list)
    # The output and race rules (devtools/reliability/fuzz_cli.py, fuzz_hostile.py, fuzz_races.py):
    raw_outputs: list[str] = field(default_factory=list)  # human output holding a raw control character
    bad_exits: list[str] = field(default_factory=list)  # an exit code that is not documented (or expected)
    files_lost: list[str] = field(default_factory=list)  # a file that existed before the case, gone
    files_replaced: list[str] = field(default_factory=list)  # a file that existed before, other bytes now
    locks_left: list[str] = field(default_factory=list)  # a lock file no live or killed owner explains
    temporaries_left: list[str] = field(default_factory=list)  # a temporary no killed writer explains

    @property
    def ok(self) -> bool:
        return not self.violations

    def statuses(self) -> dict[str, str]:
        return {name: r.get("status", "?") for name, r in self.readers.items()}


def run_case(
    seed: Seed, family: str | Family, rng_seed: int, workdir: Path, *, timeout: float = 60.0, keep: bool = False
) -> CaseResult:
    """Copy ``seed``, apply ``family`` with ``random.Random(rng_seed)``, run every reader, judge."""
    rng = random.Random(rng_seed)
    arena = new_arena(workdir / f"case-{rng_seed}", seed.step_dir)
    try:
        mutation = _family(family)(arena, rng)
        form = rng.choice(TARGET_FORMS)
        target = target_path(arena, form)
        nproc = rng.choice([1, 2, 4])
        result = CaseResult(seed.name, mutation.family, mutation.detail, form)
        before = snapshot(arena.root)
        child = fenced(lambda: run_readers_watched(target, arena, nproc), timeout)
        result.child = child["status"]
        if child["status"] == "done":
            result.readers = child["value"]["readers"]
            result.process_changes = child["value"]["process_changes"]
            result.elapsed_s = child["value"]["elapsed_s"]
            result.rss_growth_kib = child["rss_growth_kib"]
        judge(result, mutation, arena, seed, before, snapshot(arena.root))
        return result
    finally:
        if not keep:
            _force_rmtree(arena.root)


def _family(family: str | Family) -> Family:
    return FAMILIES[family] if isinstance(family, str) else family


def _force_rmtree(root: Path) -> None:
    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            path = Path(dirpath) / name
            if not path.is_symlink():
                os.chmod(path, 0o755)
    shutil.rmtree(root, ignore_errors=True)


def judge(
    result: CaseResult, mutation: Mutation, arena: Arena, seed: Seed, before: dict[str, str], after: dict[str, str]
) -> None:
    v = result.violations
    if arena.sentinel.exists():
        result.code_executed = True
        v.append("CODE EXECUTED: the payload's sentinel file exists")
    if result.process_changes:
        v.append(f"PROCESS MUTATED: a load changed shared objects: {result.process_changes[:5]}")
    if result.child != "done":
        v.append(f"reader process {result.child} (hang or crash)")
    if mutation.family == "metadata_work_bomb" and result.elapsed_s > WORK_BOMB_SECONDS:
        v.append(f"metadata work not bounded by its size: the readers took {result.elapsed_s} s")
    for name, r in result.readers.items():
        if r["status"] in ("bug", "memory"):
            v.append(f"{name}: {r['status']} {r.get('type')}: {r.get('message', '')[:200]}\n{r.get('trace', '')}")
    deleted_dcp = _deleted_dcp_prefix(result, arena)
    for rel in sorted(set(before) | set(after)):
        if rel == "out" or rel.startswith("out/") or before.get(rel) == after.get(rel):
            continue
        if deleted_dcp is not None and rel in before and rel not in after and _under(rel, deleted_dcp):
            continue
        if rel in before and rel not in after:
            result.sources_deleted.append(rel)
            v.append(f"source deleted: {rel}")
        else:
            result.outside_writes.append(rel)
            v.append(f"written outside the output dir: {rel}")
    for name in (CONVERT_MODEL, CONVERT_OPTIMIZER, CONVERT_DELETE):
        r = result.readers.get(name)
        out = arena.out / name
        if r is None:
            continue
        if r["status"] != "ok" and out.exists() and any(out.iterdir()):
            v.append(f"{name} failed but left output: {sorted(p.name for p in out.iterdir())}")
        if r["status"] == "ok":
            _check_output(name, r, out, mutation, seed, v)
    for name in mutation.must_fail:
        r = result.readers.get(name)
        if r is None or r["status"] != "ok":
            continue
        if name == INSPECT and not _inspects(result.target, mutation):
            continue  # inspect looked at another part of the checkpoint
        if name == PUSH and result.target not in PUBLISHING_FORMS:
            continue  # a push of that form never reads pretrained_model/ (and is refused anyway)
        res = r["result"]
        if (name == VERIFY and res.get("resumable")) or (name == INSPECT and res.get("healthy")):
            v.append(f"{name} accepted a checkpoint it must refuse ({mutation.detail})")
        elif name not in (VERIFY, INSPECT):
            v.append(f"{name} succeeded on a checkpoint it must refuse ({mutation.detail})")


def _inspects(form: str, mutation: Mutation) -> bool:
    """Does ``inspect`` of this target form read the damaged file?"""
    damaged = mutation.touched[0] if mutation.touched else ""
    return form in ("root", "step") or damaged.startswith(
        {"pretrained_model": "pretrained_model/", "model_dcp": MODEL_DCP, "training_state": "training_state/"}[form]
    )


def _deleted_dcp_prefix(result: CaseResult, arena: Arena) -> str | None:
    r = result.readers.get(CONVERT_DELETE)
    if not r or r["status"] != "ok" or not r["result"].get("deleted"):
        return None
    return str(Path(r["result"]["dcp_dir"]).relative_to(arena.root))


def _under(rel: str, prefix: str) -> bool:
    return rel == prefix or rel.startswith(prefix + "/")


def _check_output(name: str, r: dict[str, Any], out: Path, mutation: Mutation, seed: Seed, v: list[str]) -> None:
    from ckpt_tools.st.header import read_header

    files = [Path(f) for f in r["result"]["files"]]
    for f in files:
        if not f.is_file():
            v.append(f"{name}: reported output {f.name} does not exist")
        elif f.suffix == ".safetensors" and not read_header(f).healthy:
            v.append(f"{name}: output {f.name} is not a healthy safetensors file")
    reference = seed.reference.get(CONVERT_MODEL if name == CONVERT_DELETE else name)
    dcp_rel = MODEL_DCP if name != CONVERT_OPTIMIZER else "training_state/optimizer_0"
    if reference and not mutation.touches(dcp_rel) and all(f.is_file() for f in files):
        got = {f.name: _sha256(f) for f in files}
        if got != reference:
            v.append(f"{name}: an untouched DCP dir converted to different bytes than the pristine one")


# ====================================================================== real processes


def _limited(memory_cap: int = MEMORY_CAP) -> Any:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_cap + 2**30, memory_cap + 2**30))

    return limit


CLI_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("inspect", "{target}", "--tensors"),
    ("inspect", "{target}", "--json"),
    ("verify-resume", "{target}"),
    ("verify-resume", "{target}", "--json"),
    ("reshard-plan", "{target}", "--nproc", "2"),
    ("reshard-plan", "{target}", "--nproc", "1", "--json"),
    ("convert-dcp", "{target}", "--output", "{out}/cli-model", "--quiet"),
    ("convert-dcp", "{target}", "--what", "optimizer", "--output", "{out}/cli-opt", "--json"),
    ("convert-dcp", "{target}", "--output", "{out}/cli-delete", "--delete-dcp", "--allow-unresumable", "--quiet"),
    ("push", "{target}", "--repo-id", "alice/fuzz"),
)


def cli_problems(proc: subprocess.CompletedProcess[str], what: str) -> list[str]:
    """The rules for one CLI run: a documented code, no traceback, one ``error:`` line on failure."""
    out = []
    if proc.returncode not in DOCUMENTED_EXIT_CODES:
        out.append(f"{what}: exit {proc.returncode} is not a documented code\n{proc.stderr[-2000:]}")
    if "Traceback" in proc.stderr or "Traceback" in proc.stdout:
        out.append(f"{what}: traceback\n{proc.stderr[-3000:]}")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if proc.returncode >= 2 and (len(lines) != 1 or not lines[0].startswith("error: ")):
        out.append(f"{what}: exit {proc.returncode} without exactly one 'error:' line: {lines[:5]}")
    return out


def run_cli_case(
    seed: Seed,
    family: str | Family,
    rng_seed: int,
    workdir: Path,
    *,
    timeout: float = 60.0,
    commands: tuple[str, ...] | None = None,
) -> CaseResult:
    """The same case, but every command (or those of ``commands``, by name) as a real ``ckpt-tools``
    process without torch importable."""
    rng = random.Random(rng_seed)
    arena = new_arena(workdir / f"cli-{rng_seed}", seed.step_dir)
    try:
        mutation = _family(family)(arena, rng)
        form = rng.choice(TARGET_FORMS)
        target = target_path(arena, form)
        result = CaseResult(seed.name, mutation.family, mutation.detail, f"cli:{form}")
        before = snapshot(arena.root)
        env = no_torch_env(dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", **NO_NETWORK_ENV))
        for args in CLI_COMMANDS if commands is None else [a for a in CLI_COMMANDS if a[0] in commands]:
            argv = [a.format(target=target, out=arena.out) for a in args]
            name = " ".join(args[:1] + tuple(a for a in args[2:] if a.startswith("--") and a != "--output"))
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "ckpt_tools.cli", *argv],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    cwd=REPO,
                    preexec_fn=_limited(),
                )
            except subprocess.TimeoutExpired:
                result.violations.append(f"{name}: hung (no exit within {timeout} s)")
                result.child = "timeout"
                continue
            result.readers[name] = {"status": "ok" if proc.returncode == 0 else "error", "code": proc.returncode}
            if "MemoryError" in proc.stderr:
                result.readers[name]["status"] = "memory"
            result.violations.extend(cli_problems(proc, name))
        after = snapshot(arena.root)
        judge_cli(result, arena, before, after)
        return result
    finally:
        _force_rmtree(arena.root)


def judge_cli(result: CaseResult, arena: Arena, before: dict[str, str], after: dict[str, str]) -> None:
    if arena.sentinel.exists():
        result.code_executed = True
        result.violations.append("CODE EXECUTED: the payload's sentinel file exists")
    deleted_ok = result.readers.get("convert-dcp --delete-dcp --allow-unresumable --quiet", {}).get("status") == "ok"
    for rel in sorted(set(before) | set(after)):
        if rel == "out" or rel.startswith("out/") or before.get(rel) == after.get(rel):
            continue
        if deleted_ok and rel in before and rel not in after and "pytorch_model_fsdp_0" in rel:
            continue
        bucket = result.sources_deleted if rel in before and rel not in after else result.outside_writes
        bucket.append(rel)
        result.violations.append(f"changed outside the output dir: {rel}")


def run_train_case(
    seed: Seed, family: str | Family, rng_seed: int, workdir: Path, *, timeout: float = 240.0
) -> CaseResult:
    """The training core's resume on the damaged checkpoint: one process, saving the restored state."""
    rng = random.Random(rng_seed)
    arena = new_arena(workdir / f"train-{rng_seed}", seed.step_dir)
    try:
        mutation = _family(family)(arena, rng)
        result = CaseResult(seed.name, mutation.family, mutation.detail, "ckpt-train --resume")
        before = snapshot(arena.root)
        out = arena.out / "train"
        args = [
            "--resume=true",
            f"--config_path={arena.step}",
            f"--output_dir={out}",
            "--parallelism.dp_replicate=1",
            "--parallelism.dp_shard=1",
            "--checkpoint_format=safetensors",
            "--steps=4",
            "--progress_bar=false",
        ]
        try:
            proc = subprocess.run(
                train_command(args), env=train_env(), capture_output=True, text=True, timeout=timeout, cwd=arena.root
            )
        except subprocess.TimeoutExpired:
            result.child = "timeout"
            result.violations.append("ckpt-train --resume hung")
            return result
        result.readers["train"] = {"status": "ok" if proc.returncode == 0 else "error", "code": proc.returncode}
        if "Traceback" in proc.stderr:
            result.violations.append(f"ckpt-train: traceback\n{proc.stderr[-3000:]}")
        lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("warning:")]
        if proc.returncode != 0 and (not lines or not lines[-1].startswith("error: ")):
            result.violations.append(f"ckpt-train: exit {proc.returncode} without an 'error:' line: {lines[-3:]}")
        judge_cli(result, arena, before, snapshot(arena.root))
        return result
    finally:
        _force_rmtree(arena.root)
