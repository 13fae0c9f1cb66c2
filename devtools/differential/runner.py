"""Run one differential case end to end and classify it; plan and run a campaign of them.

A case: copy the base's resume step into a fresh arena (``<case>/ckpt/checkpoints/000002`` and
``last``), apply one mutation, then run - each a real subprocess with a deadline -
``ckpt-tools inspect --json``, ``ckpt-tools verify-resume --json``, the reference readers
(:mod:`.oracles`) and the actual ``ckpt-train --resume=true`` in the base's topology, into the
arena's copy of the run. The verdicts are then compared with what happened:

- verify *false yes*: exit 0 (warnings count as yes) but the resume was refused or crashed,
  or it ended in another state than the unmutated resume from the same step with no warning
  saying so - a warning is verify-resume's documented prediction that the resume runs but
  does not continue as the uninterrupted run would have (an edited config, another topology);
- verify *false no*: not resumable, but the resume ran and ended exactly as the reference;
- inspect *false healthy*: exit 0 while a reference reader fails on some data object;
- inspect *false unhealthy*: a failed check names a data object (a safetensors file, a DCP
  dir, a torch file) that every reference reader loads. Failures for other reasons (a file
  from another save, a record that disagrees) are claims the readers cannot judge.

Nothing here knows what a mutation *should* do: the verdicts are only ever compared with the
outcome of the real programs on the same bytes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devtools.differential import oracles
from devtools.differential.bases import FINAL_STEP, Base
from devtools.differential.mutations import FAMILIES, LEROBOT_FAMILIES, Case
from devtools.procs import REPO, kill_tree
from devtools.reliability.crash_harness import worker_tracebacks
from devtools.reliability.fuzz_mutations import Arena
from devtools.training import train_command, train_env

TOOL_TIMEOUT = 120.0
RESUME_TIMEOUT = 300.0
# Checks of ``inspect`` that name a DCP dir but judge the record, not whether the data loads.
NON_DATA_SUFFIXES = (" ranks",)


@dataclass(frozen=True)
class CaseSpec:
    index: int
    family: str
    base: str
    seed: int


@dataclass
class Proc:
    """A finished (or killed) subprocess, trimmed for the record."""

    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    @property
    def traceback(self) -> bool:
        """A traceback of ours (torchrun's own ``ChildFailedError`` after a worker's clean exit 1 is not)."""
        return bool(worker_tracebacks(self.stderr) or worker_tracebacks(self.stdout))

    def line(self) -> str:
        """The line that says why: the last ``error:`` line, else the last line of stderr or stdout."""
        raised = worker_tracebacks(self.stderr) or worker_tracebacks(self.stdout)
        if raised:
            return oracles.describe(raised[0])
        lines = [ln.strip() for ln in (self.stderr + "\n" + self.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error:" in ln]
        return oracles.describe((errors or lines or [""])[-1])


@dataclass
class CaseResult:
    spec: CaseSpec
    detail: str = ""
    arena: str = ""
    verify: dict[str, Any] = field(default_factory=dict)
    inspect: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, str] = field(default_factory=dict)
    resume: dict[str, Any] = field(default_factory=dict)
    verdicts: dict[str, bool] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def disagreements(self) -> list[str]:
        return [k for k, v in self.verdicts.items() if v]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "disagreements": self.disagreements}


def run_bounded(cmd: list[str], env: dict[str, str], timeout: float, cwd: Path | None = None) -> Proc:
    """Run ``cmd`` to its end or its deadline; at the deadline the whole tree (torchrun's workers too) is killed."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        timed_out = True
    return Proc(proc.returncode, out[-20000:], err[-20000:], round(time.monotonic() - start, 2), timed_out)


def tool(*args: str, env: dict[str, str]) -> Proc:
    return run_bounded([sys.executable, "-m", "ckpt_tools.cli", *args], env, TOOL_TIMEOUT, cwd=REPO)


def resume_command(step: Path, nproc: int) -> list[str]:
    config = step / "pretrained_model" / "train_config.json"
    return train_command(["--resume=true", f"--config_path={config}", f"--steps={FINAL_STEP}"], nproc)


# ====================================================================== one campaign


class Campaign:
    """Bases, their reference resumes, and the cases run against them, under one work directory."""

    def __init__(self, work: Path, bases: dict[str, Base], findings: Path | None = None, keep: bool = False) -> None:
        self.work = work
        self.bases = bases
        self.findings = findings
        self.keep = keep  # keep every arena (else only those of disagreements)
        self.env = train_env({"CKPT_TOOLS_CACHE_DIR": str(work / "tools-cache")})
        self.references: dict[str, tuple[Path, list[float] | None]] = {}
        self.notes: list[str] = []

    # ------------------------------------------------------------ setup

    def new_case(self, name: str, base: Base) -> Case:
        root = self.work / "cases" / name
        if root.exists():
            shutil.rmtree(root)
        step_name = base.step_dir().name
        arena = Arena(root, step_rel=f"ckpt/checkpoints/{step_name}")
        arena.checkpoints.mkdir(parents=True)
        shutil.copytree(base.step_dir(), arena.step, symlinks=True)
        (arena.checkpoints / "last").symlink_to(step_name)
        arena.outside.mkdir()
        arena.out.mkdir()
        return Case(arena, base)

    def reference(self, base: Base) -> tuple[Path, list[float] | None] | None:
        """The unmutated resume of ``base`` (run once): its final step dir and the losses it logged."""
        if base.trainer != "ckpt-train":
            return None
        if base.name not in self.references:
            case = self.new_case(f"reference-{base.name}", base)
            proc = run_bounded(resume_command(case.step, base.nproc), self.env, RESUME_TIMEOUT)
            if proc.rc != 0:
                raise RuntimeError(f"the unmutated resume of {base.name} failed: {proc.line()}")
            final = case.arena.checkpoints / f"{FINAL_STEP:06d}"
            same = oracles.final_state_differences(final, base.later)
            self.notes.append(
                f"{base.name}: the unmutated resume from step {base.step} "
                + (
                    "ends bit-identical to the original run's step 4"
                    if not same
                    else f"differs from the original run: {same}"
                )
            )
            self.references[base.name] = (final, oracles.logged_losses(case.arena.ckpt))
        return self.references[base.name]

    # ------------------------------------------------------------ planning

    @staticmethod
    def plan(seed: int, count: int, families: list[str], bases: dict[str, Base]) -> list[CaseSpec]:
        """``count`` cases, families in turn, each on a base drawn (reproducibly) from those it applies to."""
        specs = []
        for index in range(count):
            family = families[index % len(families)]
            rng = random.Random(f"{seed}:{index}")
            fitting = sorted(n for n, b in bases.items() if b.trainer == "ckpt-train" or family in LEROBOT_FAMILIES)
            if not fitting:
                continue
            specs.append(CaseSpec(index, family, rng.choice(fitting), seed))
        return specs

    # ------------------------------------------------------------ one case

    def run(self, spec: CaseSpec) -> CaseResult:
        start = time.monotonic()
        base = self.bases[spec.base]
        reference = self.reference(base)
        case = self.new_case(f"case-{spec.index:05d}", base)
        result = CaseResult(spec, arena=str(case.arena.root))
        rng = random.Random(f"{spec.seed}:{spec.index}:{spec.family}")
        mutation = FAMILIES[spec.family](case, rng)
        result.detail = f"{mutation.family}: {mutation.detail}"

        result.inspect = self._inspect(case)
        result.reference = oracles.reference_verdicts(case.step)
        result.verify = self._verify(case)
        result.resume = self._resume(case, reference)
        result.verdicts = classify(result)
        result.seconds = round(time.monotonic() - start, 2)
        if result.disagreements and self.findings is not None:
            append_finding(self.findings, result)
        if not self.keep and not result.disagreements:
            shutil.rmtree(case.arena.root, ignore_errors=True)
        return result

    def _inspect(self, case: Case) -> dict[str, Any]:
        proc = tool("inspect", str(case.step), "--json", env=self.env)
        out: dict[str, Any] = {"rc": proc.rc, "error": _tool_error(proc, {0, 1, 3}), "line": proc.line()}
        try:
            doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
        except ValueError:
            doc = {}
        failed = [c for c in doc.get("checks", []) if c.get("status") == "fail"]
        out["failed"] = [f"{c['name']}: {oracles.describe(c.get('message', ''))}" for c in failed]
        out["failed_names"] = [c["name"] for c in failed]
        return out

    def _verify(self, case: Case) -> dict[str, Any]:
        proc = tool("verify-resume", str(case.step), "--json", env=self.env)
        out: dict[str, Any] = {"rc": proc.rc, "error": _tool_error(proc, {0, 1, 2, 3}), "line": proc.line()}
        try:
            doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
        except ValueError:
            doc = {}
        checks = doc.get("checks", [])
        out["trainer"] = doc.get("trainer")
        out["failed"] = [
            f"{c['name']}: {oracles.describe(c.get('message', ''))}" for c in checks if c.get("status") == "fail"
        ]
        out["warned"] = [
            f"{c['name']}: {oracles.describe(c.get('message', ''))}" for c in checks if c.get("status") == "warn"
        ]
        out["resumable"] = proc.rc == 0
        return out

    def _resume(self, case: Case, reference: tuple[Path, list[float] | None] | None) -> dict[str, Any]:
        if reference is None:
            return {"outcome": "not-run", "line": "LeRobot wrote it: its resume is lerobot-train's, not installed here"}
        proc = run_bounded(resume_command(case.step, case.base.nproc), self.env, RESUME_TIMEOUT)
        out: dict[str, Any] = {"rc": proc.rc, "line": proc.line(), "seconds": proc.seconds}
        if proc.timed_out or proc.rc is None or proc.rc < 0 or proc.traceback:
            out["outcome"] = "crash"
            out["why"] = "timeout" if proc.timed_out else ("traceback" if proc.traceback else f"signal {proc.rc}")
            return out
        if proc.rc != 0:
            out["outcome"] = "refused"
            return out
        final = case.arena.checkpoints / f"{FINAL_STEP:06d}"
        diffs = oracles.final_state_differences(final, reference[0])
        mine = oracles.logged_losses(case.arena.ckpt)
        if mine is not None and not oracles.same_losses(mine, reference[1]):
            diffs.append(f"losses {mine} vs the reference's {reference[1]}")
        out["outcome"] = "different" if diffs else "equal"
        out["differences"] = diffs
        return out


def _tool_error(proc: Proc, documented: set[int]) -> str | None:
    """Why a tool's run is itself a defect (a traceback, a hang, an undocumented exit code), else None."""
    if proc.timed_out:
        return "timeout"
    if proc.traceback:
        return "traceback"
    if proc.rc not in documented:
        return f"exit {proc.rc}"
    return None


def classify(result: CaseResult) -> dict[str, bool]:
    """The disagreements of one case (True where the tool's verdict is not what happened)."""
    verify, resume, inspect = result.verify, result.resume, result.inspect
    outcome = resume.get("outcome")
    says_yes = verify.get("rc") == 0 and not verify.get("error")
    says_no = verify.get("rc") in (1, 2, 3) and not verify.get("error")
    objects = sorted(result.reference)
    broken = [rel for rel, verdict in result.reference.items() if verdict != "ok"]
    blamed = [
        name
        for name in inspect.get("failed_names", [])
        if not name.endswith(NON_DATA_SUFFIXES)
        and any(name == rel or name.startswith(rel + " ") or name.startswith(rel + "/") for rel in objects)
    ]
    return {
        "verify_false_yes": says_yes
        and (outcome in ("refused", "crash") or (outcome == "different" and not verify.get("warned"))),
        "verify_false_no": says_no and outcome == "equal",
        "verify_error": bool(verify.get("error")),
        "inspect_false_healthy": inspect.get("rc") == 0 and not inspect.get("error") and bool(broken),
        "inspect_false_unhealthy": inspect.get("rc") == 1 and not broken and bool(blamed),
        "inspect_error": bool(inspect.get("error")),
        "resume_traceback": outcome == "crash",
    }


# ====================================================================== findings


def append_finding(path: Path, result: CaseResult) -> None:
    """One disagreement, with what is needed to reproduce it, appended to the findings file."""
    spec, verify, resume, inspect = result.spec, result.verify, result.resume, result.inspect
    broken = {k: v for k, v in result.reference.items() if v != "ok"}
    verify_line = (
        verify.get("failed")
        or verify.get("warned")
        or ["RESUMABLE, no warnings" if verify.get("rc") == 0 else verify.get("line", "")]
    )[0]
    lines = [
        f"### {', '.join(result.disagreements)} - {spec.family} on {spec.base} (case {spec.index}, seed {spec.seed})",
        "",
        f"- mutation: `{result.detail}`",
        f"- verify-resume: exit {verify.get('rc')}{' (' + verify['error'] + ')' if verify.get('error') else ''}: `{verify_line}`",
        f"- resume: {resume.get('outcome')} (exit {resume.get('rc')}): `{resume.get('line', '')}`"
        + (f"; differences: {resume.get('differences')}" if resume.get("differences") else ""),
        f"- inspect: exit {inspect.get('rc')}: `{(inspect.get('failed') or ['HEALTHY' if inspect.get('rc') == 0 else inspect.get('line', '')])[0]}`",
        f"- reference readers: {broken or 'all load'}",
        f"- arena (kept): `{result.arena}`; rerun: `bin/differential-report --seed {spec.seed} --case {spec.index}`",
        "",
    ]
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        os.fsync(f.fileno())
