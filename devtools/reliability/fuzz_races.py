"""Races and signals around ``convert-dcp``, each interleaving forced at an exact point, so it reproduces.

One writer per directory (:mod:`ckpt_tools.io.dir_lock`), exclusive placement of the outputs,
``--delete-dcp`` deleting the shards only while the verified output is still the one there,
leftover temporaries judged by their host, and stops that unwind (docs/tools.md): each was a
race that timing alone hardly ever shows. Here the conversion is a forked process
(:mod:`devtools.reliability.fuzz_cli`) that stops at a *pause point* while the campaign acts:

- ``lock_held``: another process owns the output directory (alive; killed; alive or killed on
  "another host"; a lock file of garbage; one naming a hostile owner) - refused in one line
  while the owner lives, taken over once it is gone;
- ``output_appears``: a file, a directory or a symlink appears at an output path just before the
  commit (other bytes or the very same) - never replaced, nothing of the conversion left;
- ``replaced_before_delete``: with ``--delete-dcp``, an output is replaced, rewritten in place,
  touched or removed between the verification and the deletion - the shards are kept;
- ``signal_mid_convert``: SIGTERM, SIGHUP, SIGQUIT, SIGINT or SIGKILL once the lock is taken, a
  temporary exists, a file is finished, at or after a commit, or at the deletion - exit 130 with
  nothing left; after a SIGKILL, the rerun finishes and removes what the killed run left;
- ``two_converters``: a second conversion into the same directory while the first writes -
  refused; the first completes;
- ``foreign_temporary``: temporaries of another host, of a live process, of dead ones (with and
  without a host tag) and of a file no conversion writes, in the output directory - only the
  abandoned ones of this host's conversions are removed.

The rules (:func:`judge`): every run's exit code is the one the interleaving calls for (all of
them documented: 0-5, 130 for a stop); no traceback, no hang, one ``error:`` line, no raw
control character; every file that existed before the case - shards, outputs, planted files -
is there with the same bytes at the end, unless the scenario removes it by rule (an abandoned
lock or temporary, the shards of a verified ``--delete-dcp``); no lock file unless a killed
process held it; no temporary unless a killed writer left it; a conversion that exited 0
wrote exactly the reference bytes, one that failed left no output.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.reliability.fuzz_cli import INTERRUPTED, CliRun, output_problems, pause, run_cli
from devtools.reliability.fuzz_hostile import hostile_string

LOCK = ".ckpt-tools.lock"
MODEL_DCP = "pretrained_model/pytorch_model_fsdp_0"
DEAD_PID = 4194305  # above Linux's largest pid_max: never a live process
OTHER_HOST = "fuzz-host-a"
# Conversion options (``{out}``: the case's output directory outside the step).
OPTIONS: tuple[tuple[str, ...], ...] = (
    ("--output", "{out}"),
    ("--output", "{out}", "--dtype", "bf16"),
    ("--output", "{out}", "--max-shard-size", "40KB"),
    ("--output", "{out}", "--what", "optimizer"),
    ("--delete-dcp", "--allow-unresumable"),  # beside the shards (LeRobot's dcp runs need the waiver)
    ("--output", "{out}", "--delete-dcp", "--allow-unresumable"),
)
SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGINT, signal.SIGKILL)
POINTS = ("locked", "temp", "finished", "commit", "committed", "delete")
# The converter's lock timing (the defaults are 5 s and 30 s): another host's lock is live while
# touched within two heartbeats, abandoned after the lease.
CONVERTER_HEARTBEAT_S = 1.0
CONVERTER_LEASE_S = 4.0
_REFERENCES: dict[tuple[str, tuple[str, ...]], dict[str, str]] = {}


@dataclass
class Race:
    """One case's arena, the conversion it runs, and what the scenario allows to differ at the end."""

    root: Path
    step: Path
    options: tuple[str, ...]
    reference: dict[str, str] = field(default_factory=dict)  # output file name -> sha256 (pristine conversion)
    planted: dict[str, str] = field(default_factory=dict)  # rel path -> digest of what the campaign placed mid-run
    may_remove: set[str] = field(default_factory=set)  # rel paths the rules allow to disappear
    lock_may_stay: bool = False  # a killed process held the output's lock
    temps_may_stay: bool = False  # a killed writer left its temporaries
    holders: list[int] = field(default_factory=list)
    may_keep_output: bool = False  # stopped after its verified commit: the complete output may stay
    before: dict[str, str] = field(default_factory=dict)  # the arena when the first conversion started
    missed: list[str] = field(default_factory=list)  # forced interleavings that never happened (a vacuous case)
    runs: list[tuple[CliRun, frozenset[int]]] = field(default_factory=list)
    detail: str = ""

    @property
    def out(self) -> Path:
        return self.root / "out" / "conv" if "--output" in self.options else self.step / "pretrained_model"

    @property
    def deletes(self) -> bool:
        return "--delete-dcp" in self.options

    def argv(self, *extra: str) -> list[str]:
        opts = [o.format(out=self.root / "out" / "conv") for o in self.options]
        return ["convert-dcp", str(self.step), "--quiet", *opts, *extra]

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def start(self) -> None:
        """The scenario's setup is done: every file there now is one the rules protect."""
        from devtools.reliability.fuzz_runner import snapshot

        self.before = snapshot(self.root)

    def plant(self, path: Path) -> None:
        from devtools.reliability.fuzz_runner import snapshot

        self.planted[self.rel(path)] = snapshot(path.parent).get(path.name, "gone")


# ----------------------------------------------------------------------------- processes


def start_holder(directory: Path, *, host: str | None = None, heartbeat: float = 0.2) -> int:
    """A process that owns ``directory``'s lock (as ``host``, heartbeating) until it is killed."""
    from ckpt_tools.io import dir_lock

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            if host:
                os.environ["CKPT_TOOLS_HOST_ID"] = host
            dir_lock.HEARTBEAT_S = heartbeat
            dir_lock.DirLock(directory, "convert-dcp").acquire()
            os.write(w, b"h")
            while True:
                time.sleep(60)
        finally:
            os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 30)
    if not ready or os.read(r, 1) != b"h":
        raise RuntimeError("the lock holder never took the lock")
    os.close(r)
    return pid


def stop(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def pause_points(wanted: set[str], *, lease_s: float = CONVERTER_LEASE_S) -> Callable[[], None]:
    """A ``setup`` for the child: pause (once each) at the ``wanted`` points of a conversion."""

    def setup() -> None:
        from ckpt_tools import convert
        from ckpt_tools.convert import delete as convert_delete
        from ckpt_tools.io import dir_lock
        from ckpt_tools.st import writer

        dir_lock.LEASE_S, dir_lock.HEARTBEAT_S = lease_s, CONVERTER_HEARTBEAT_S  # seconds, not 30
        seen: set[str] = set()

        def once(point: str, message: str) -> None:
            if point in wanted and point not in seen:
                seen.add(point)
                pause(message)

        def wrap(owner: Any, name: str, before: str | None, after: str | None, with_path: bool = False) -> None:
            original = getattr(owner, name)

            def wrapped(*args: Any, **kwargs: Any) -> Any:
                path = getattr(args[0], "path", "") if with_path and args else ""
                if before:
                    once(before, f"{before} {path}".strip())
                value = original(*args, **kwargs)
                if after:
                    once(after, f"{after} {path}".strip())
                return value

            setattr(owner, name, wrapped)

        wrap(dir_lock.DirLock, "acquire", None, "locked")
        wrap(writer.StreamingWriter, "open", None, "temp", with_path=True)
        wrap(writer.StreamingWriter, "finish", None, "finished", with_path=True)
        wrap(writer.StreamingWriter, "commit", "commit", "committed", with_path=True)
        wrap(convert, "_delete_verified", "verified", None)
        wrap(convert_delete, "delete_dcp_dir", "delete", None)

    return setup


# ----------------------------------------------------------------------------- scenarios


def _options(rng: random.Random, *, delete: bool | None = None, shards: bool = False) -> tuple[str, ...]:
    pool = [o for o in OPTIONS if (delete is None or ("--delete-dcp" in o) == delete)]
    if shards:
        pool = [o for o in pool if "--max-shard-size" in o]
    return rng.choice(pool)


def lock_held(race: Race, rng: random.Random) -> None:
    variant = rng.choice(["live", "dead", "live_other_host", "dead_other_host", "hostile_owner", "garbage"])
    race.detail = f"output lock: {variant}"
    race.out.mkdir(parents=True, exist_ok=True)
    lock = race.out / LOCK
    if variant in ("live", "dead", "live_other_host", "dead_other_host"):
        pid = start_holder(race.out, host=OTHER_HOST if "other_host" in variant else None)
        race.holders.append(pid)
        if variant.startswith("dead"):
            stop(pid)
            race.may_remove.add(race.rel(lock))
            if variant == "dead_other_host":  # past two heartbeats: no longer taken for live at once
                time.sleep(2 * CONVERTER_HEARTBEAT_S + 0.2)
    elif variant == "hostile_owner":  # a lock of "another host" whose fields hold hostile strings, fresh
        owner = {
            "host": hostile_string(rng),
            "boot": "b",
            "pid": rng.randrange(1, 2**31),
            "started": "",
            "token": "t",
            "command": hostile_string(rng),
        }
        lock.write_text(json.dumps(owner))
    else:
        lock.write_bytes(rng.randbytes(rng.randrange(0, 64)))
        race.may_remove.add(race.rel(lock))
    live = variant in ("live", "live_other_host", "hostile_owner")
    race.lock_may_stay = live
    race.start()
    run = run_cli(race.argv(), setup=pause_points(set()), timeout=60)
    race.runs.append((run, frozenset({4}) if live else frozenset({0})))
    if live and "in use by" not in run.stderr:
        race.runs.append((run, frozenset()))  # refused for another reason than the owner: wrong


def output_appears(race: Race, rng: random.Random) -> None:
    what = rng.choice(["other bytes", "same bytes", "directory", "symlink out"])
    second = "--max-shard-size" in race.options and rng.random() < 0.5
    race.detail = f"{what} appears at {'another output' if second else 'the output'} at the first commit"

    def act(point: str, pid: int) -> None:
        path = Path(point.split(" ", 1)[1])
        if second:
            others = sorted(n for n in race.reference if n != path.name)
            path = path.with_name(others[-1]) if others else path
        if what == "directory":
            path.mkdir()
        elif what == "symlink out":
            os.symlink(race.root / "outside" / "secret.bin", path)
        elif what == "same bytes" and path.name in race.reference:
            shutil.copyfile(_reference_dir(race) / path.name, path)
        else:
            path.write_bytes(rng.randbytes(64))
        race.plant(path)

    race.start()
    run = run_cli(race.argv(), setup=pause_points({"commit"}), controller=act, timeout=60)
    race.runs.append((run, frozenset({4})))
    if not run.points or "appeared while this conversion was writing" not in run.stderr:
        race.missed.append(f"no file appeared at a commit: {run.points} {run.stderr.strip()[:200]!a}")


def replaced_before_delete(race: Race, rng: random.Random) -> None:
    how = rng.choice(["replaced", "replaced by the same bytes", "rewritten in place", "touched", "removed"])
    race.detail = f"an output {how} between the verification and the deletion"

    def act(point: str, pid: int) -> None:
        names = sorted(race.reference)
        path = race.out / rng.choice(names)
        if how == "replaced":
            tmp = path.with_name("fuzz-replacement")
            tmp.write_bytes(rng.randbytes(128))
            os.replace(tmp, path)
        elif how == "replaced by the same bytes":
            tmp = path.with_name("fuzz-replacement")
            shutil.copyfile(path, tmp)
            os.replace(tmp, path)
        elif how == "rewritten in place":
            with open(path, "r+b") as f:
                f.seek(max(0, path.stat().st_size - 4))
                f.write(rng.randbytes(4))
        elif how == "touched":
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        else:
            path.unlink()
        race.plant(path)

    race.start()
    run = run_cli(race.argv(), setup=pause_points({"verified"}), controller=act, timeout=60)
    race.runs.append((run, frozenset({4})))
    if not run.points:
        race.missed.append("the conversion never reached its deletion")
    if "DCP shards kept" not in run.stderr:
        race.runs.append((run, frozenset()))


def signal_mid_convert(race: Race, rng: random.Random) -> None:
    points = [p for p in POINTS if p != "delete" or race.deletes]
    if "--max-shard-size" not in race.options:
        points.remove("committed")  # one file: after its commit comes only the index or nothing
    point = rng.choice(points)
    sig = rng.choice(SIGNALS)
    race.detail = f"{signal.Signals(sig).name} at {point}"

    def act(message: str, pid: int) -> None:
        os.kill(pid, sig)

    race.start()
    run = run_cli(race.argv(), setup=pause_points({point}), controller=act, timeout=60)
    if not run.points:
        race.missed.append(f"the conversion never reached {point}")
    if sig == signal.SIGKILL:
        race.runs.append((run, frozenset({-signal.SIGKILL})))
        # A killed writer leaves its temporary and its lock; the same command again removes both.
        rerun = run_cli(race.argv(), timeout=60)
        race.runs.append((rerun, frozenset({0})))
    else:
        race.runs.append((run, frozenset({INTERRUPTED})))
        if point == "delete":  # committed and verified, then stopped before the deletion: output kept
            race.may_keep_output = True


def two_converters(race: Race, rng: random.Random) -> None:
    extra = rng.choice([(), ("--overwrite",), ("--overwrite", "--dtype", "fp16")])
    race.detail = f"a second conversion {' '.join(extra) or '(same flags)'} while the first writes"

    def act(point: str, pid: int) -> None:
        second = run_cli(race.argv(*extra), timeout=60)
        race.runs.append((second, frozenset({4})))
        if "in use by" not in second.stderr:
            race.runs.append((second, frozenset()))

    race.start()
    first = run_cli(race.argv(), setup=pause_points({"temp"}), controller=act, timeout=60)
    race.runs.append((first, frozenset({0})))
    if not first.points:
        race.missed.append("the first conversion never wrote a temporary")


def foreign_temporary(race: Race, rng: random.Random) -> None:
    from ckpt_tools.io.host import host_tag

    race.out.mkdir(parents=True, exist_ok=True)
    here, other = host_tag(), "0badc0de"
    name = sorted(race.reference)[0] if race.reference else "model.safetensors"
    kinds = {
        "other host": (f".{name}.{DEAD_PID}@{other}-fz1.tmp", False),
        "live process": (f".{name}.{os.getpid()}@{here}-fz2.tmp", False),
        "dead process": (f".{name}.{DEAD_PID}@{here}-fz3.tmp", True),
        "dead, no host": (f".model-bf16.safetensors.{DEAD_PID + 1}-fz4.tmp", True),
        "not a conversion's": (f".notes.txt.{DEAD_PID}@{here}-fz5.tmp", False),
    }
    chosen = rng.sample(sorted(kinds), rng.randrange(1, len(kinds) + 1))
    for kind in chosen:
        file_name, removable = kinds[kind]
        path = race.out / file_name
        path.write_bytes(rng.randbytes(32))
        if removable:
            race.may_remove.add(race.rel(path))
    race.detail = "temporaries: " + ", ".join(chosen)
    race.start()
    run = run_cli(race.argv(), setup=pause_points(set()), timeout=60)
    race.runs.append((run, frozenset({0})))


SCENARIOS: dict[str, tuple[Callable[[Race, random.Random], None], dict[str, Any]]] = {
    "lock_held": (lock_held, {}),
    "output_appears": (output_appears, {"delete": False}),
    "replaced_before_delete": (replaced_before_delete, {"delete": True}),
    "signal_mid_convert": (signal_mid_convert, {}),
    "two_converters": (two_converters, {"delete": False}),
    "foreign_temporary": (foreign_temporary, {}),
}


# ----------------------------------------------------------------------------- references


def _reference_dir(race: Race) -> Path:
    return race.root / "reference"


def reference(seed: Any, options: tuple[str, ...], scratch: Path) -> dict[str, str]:
    """The files a conversion with ``options`` writes from the pristine seed: name -> sha256 (cached)."""
    from devtools.reliability.fuzz_runner import snapshot

    key = (str(seed.step_dir), options)
    if key not in _REFERENCES:
        work = scratch / f"reference-{len(_REFERENCES)}"
        shutil.rmtree(work, ignore_errors=True)
        race = Race(work, work / "ckpt/checkpoints/000004", options)
        shutil.copytree(seed.step_dir, race.step, symlinks=True)
        run = run_cli(race.argv(), timeout=120)
        if run.code != 0:
            raise RuntimeError(f"the pristine conversion {options} failed: {run.stderr[-500:]}")
        store = scratch / f"reference-files-{len(_REFERENCES)}"
        shutil.rmtree(store, ignore_errors=True)
        store.mkdir(parents=True)
        names = {n: d for n, d in snapshot(race.out).items() if "/" not in n and not n.startswith(".") and d != "dir"}
        if race.out == race.step / "pretrained_model":  # beside the step's own files: only what it wrote
            names = {n: d for n, d in names.items() if n.startswith("model") and n.endswith((".safetensors", ".json"))}
        for n in names:
            shutil.copyfile(race.out / n, store / n)
        _REFERENCES[key] = names
        _REFERENCES[(str(seed.step_dir), ("store", *options))] = {"dir": str(store)}
        shutil.rmtree(work, ignore_errors=True)
    return _REFERENCES[key]


# ----------------------------------------------------------------------------- one case


def run_race_case(seed: Any, family: str, rng_seed: int, workdir: Path, *, timeout: float = 60.0) -> Any:
    """Copy ``seed`` (a step with model DCP shards), run the scenario ``family`` seeded by ``rng_seed``, judge."""
    from devtools.reliability.fuzz_runner import CaseResult, _force_rmtree, new_arena

    rng = random.Random(rng_seed)
    scenario, constraints = SCENARIOS[family]
    options = _options(rng, **constraints)
    if family == "output_appears" and rng.random() < 0.4:
        options = _options(rng, delete=False, shards=True)
    refs = reference(seed, options, workdir / "references")
    workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"{family}-{rng_seed}-", dir=workdir))
    result = CaseResult(seed.name, family, "", " ".join(options))
    try:
        arena = new_arena(root, seed.step_dir)
        race = Race(root, arena.step, options, refs)
        shutil.copytree(Path(_REFERENCES[(str(seed.step_dir), ("store", *options))]["dir"]), _reference_dir(race))
        try:
            scenario(race, rng)
        finally:
            for pid in race.holders:
                stop(pid)
        result.detail = race.detail
        judge(race, result, race.before)
        return result
    finally:
        _force_rmtree(root)


def judge(race: Race, result: Any, before: dict[str, str]) -> None:
    """The rules of the module doc, on every run and on the arena at the end."""
    from devtools.reliability.fuzz_runner import snapshot

    v = result.violations
    v += [f"the forced interleaving did not happen: {m}" for m in race.missed]
    for run, allowed in race.runs:
        if not allowed:
            v.append(f"{run.name}: refused for another reason than the race: {run.stderr.strip()[:300]!a}")
            result.bad_exits.append(run.name)
            continue
        problems = output_problems(run, allowed=allowed)
        v += problems
        result.raw_outputs += [p for p in problems if "raw control" in p]
        result.bad_exits += [p for p in problems if "is not one of" in p]
        result.readers[f"{run.name} #{len(result.readers)}"] = {
            "status": "ok" if run.code == 0 else "error",
            "code": run.code,
        }
        if run.code is None:
            result.child = "timeout"
    last = race.runs[-1][0] if race.runs else None
    converted = last is not None and last.code == 0 and last.argv[:2] == race.argv()[:2]
    after = snapshot(race.root)
    out_rel = race.rel(race.out)
    deleted = converted and race.deletes
    step_rel = race.rel(race.step)
    dcp_rel = f"{step_rel}/{MODEL_DCP}"
    for rel, digest in sorted(before.items()):
        if rel.startswith("reference") or rel in race.planted or rel in race.may_remove:
            continue
        if deleted and (rel == dcp_rel or rel.startswith(dcp_rel + "/")):
            continue  # a verified --delete-dcp: the shards go, all of them (checked below)
        if converted and rel == f"{step_rel}/training_state/save_files.json":
            continue  # a conversion into the step records its files there
        if rel not in after:
            result.files_lost.append(rel)
            v.append(f"lost: {rel!a}")
        elif after[rel] != digest and not (rel.endswith(LOCK) and race.lock_may_stay):
            result.files_replaced.append(rel)
            v.append(f"replaced: {rel!a}")
    for rel, digest in sorted(race.planted.items()):
        if after.get(rel, "gone") != digest:
            result.files_replaced.append(rel)
            v.append(f"the file placed at {rel!a} mid-conversion was replaced or removed")
    if deleted and any(rel == dcp_rel or rel.startswith(dcp_rel + "/") for rel in after):
        result.files_lost.append(dcp_rel)
        v.append(f"a verified --delete-dcp left part of the shards: {dcp_rel!a}")
    lock = f"{out_rel}/{LOCK}"
    if (
        lock in after
        and not race.lock_may_stay
        and not (before.get(lock) and after[lock] == before[lock] and lock not in race.may_remove)
    ):
        result.locks_left.append(lock)
        v.append(f"the output's lock was left: {lock}")
    for rel in sorted(after):
        name = rel.rsplit("/", 1)[-1]
        temp = name.startswith(".") and (
            name.endswith(".tmp") or ".deleting-" in name or "ckpt-tools-clock" in name or name.endswith(".break")
        )
        if temp and rel not in before and not race.temps_may_stay:
            result.temporaries_left.append(rel)
            v.append(f"temporary left: {rel!a}")
    outputs = {n: after.get(f"{out_rel}/{n}") for n in race.reference}
    written = {n: d for n, d in outputs.items() if d is not None and f"{out_rel}/{n}" not in race.planted}
    if converted and written != race.reference:
        v.append(f"the conversion exited 0 but its output differs from the pristine conversion: {sorted(written)}")
        result.files_replaced.append(out_rel)
    elif not converted and written and not race.may_keep_output:
        fresh = {n for n in written if f"{out_rel}/{n}" not in before}
        if fresh:
            v.append(f"a failed conversion left output: {sorted(fresh)}")
    if race.may_keep_output and written and written != race.reference:
        v.append(f"a stopped conversion left a partial output: {sorted(written)}")
