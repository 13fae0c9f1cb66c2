"""Non-finite trials: NaN and inf in flags, statistics, frames and the training itself, counted.

Each trial launches the real ``ckpt-train`` (tiny, one or two processes) with one source of
NaN: a flag, a ``meta/stats.json`` value, a frame, or a learning rate that makes the loss
overflow. Then it checks, with torch as the oracle (``isfinite`` on every tensor torch itself
reads back, gathered weights, flat optimizer state and DCP shards alike), that no committed
checkpoint holds a NaN or an infinity, that ``last`` resolves, and how the run ended: the
workers' exit code (under torchrun, as its failure summary reports it: torchrun itself exits
1 and prints its own ``ChildFailedError``, which is left out), one ``error:`` line or not, a
worker traceback or not.

    python -m devtools.reliability.nonfinite_trials [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.reliability.crash_harness import worker_tracebacks
from devtools.training import FIXTURE_DATASET, TINY, dcp_to_dict, train

Mutation = Callable[[Path], None]  # edits a copy of the dataset


def _stat(column: str, key: str, index: int, value: float) -> Mutation:
    def mutate(root: Path) -> None:
        path = root / "meta" / "stats.json"
        stats = json.loads(path.read_text())
        stats[column][key][index] = value
        path.write_text(json.dumps(stats))

    return mutate


def _frame(column: str, row: int, value: float) -> Mutation:
    def mutate(root: Path) -> None:
        from safetensors.torch import load_file, save_file

        path = root / "data" / "frames.safetensors"
        columns = load_file(str(path))
        columns[column][row, 0] = value
        save_file(columns, str(path))

    return mutate


@dataclass(frozen=True)
class Trial:
    name: str
    source: str  # flag | statistics | frames | training
    flags: tuple[str, ...] = ()
    mutate: Mutation | None = None
    nproc: int = 1


TRIALS = (
    Trial("lr=nan", "flag", ("--optimizer.lr=nan",)),
    Trial("lr=inf", "flag", ("--optimizer.lr=inf",)),
    Trial("lr=1e39 (AdamW step overflows)", "flag", ("--optimizer.lr=1e39",)),
    Trial("min_lr_ratio=nan", "flag", ("--scheduler.min_lr_ratio=nan",)),
    Trial("weight_decay=nan", "flag", ("--optimizer.weight_decay=nan",)),
    Trial("betas=[0.9,nan]", "flag", ("--optimizer.betas=[0.9,nan]",)),
    Trial("eps=inf", "flag", ("--optimizer.eps=inf",)),
    Trial("grad_clip_norm=nan", "flag", ("--optimizer.grad_clip_norm=nan",)),
    Trial("dropout=nan", "flag", ("--policy.dropout=nan",)),
    Trial("collective_timeout_s=inf", "flag", ("--collective_timeout_s=inf",)),
    Trial("stats mean NaN", "statistics", mutate=_stat("observation.state", "mean", 2, math.nan)),
    Trial("stats std 0", "statistics", mutate=_stat("action", "std", 1, 0.0)),
    Trial("stats std inf", "statistics", mutate=_stat("action", "std", 0, math.inf)),
    Trial("frame action NaN", "frames", mutate=_frame("action", 700, math.nan)),
    Trial("frame state -inf", "frames", mutate=_frame("observation.state", 10, -math.inf)),
    Trial("lr=1e20 (loss NaN at step 2)", "training", ("--optimizer.lr=1e20",)),
    Trial("lr=1e20, skip 2", "training", ("--optimizer.lr=1e20", "--max_nonfinite_steps=2")),
    Trial("lr=1e20, async save", "training", ("--optimizer.lr=1e20", "--checkpoint_async=true")),
    Trial("weight_decay=1e22 (weights blow up)", "training", ("--optimizer.weight_decay=1e22",)),
    Trial("lr=1e20, DDP 2", "training", ("--optimizer.lr=1e20",), nproc=2),
    Trial(
        "lr=1e20, FSDP 2, dcp",
        "training",
        ("--optimizer.lr=1e20", "--parallelism.dp_shard=2", "--checkpoint_format=dcp"),
        nproc=2,
    ),
)


def _all_finite(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_all_finite(v) for v in value)
    return True


def _step_finite(step: Path, scratch: Path) -> bool:
    """Every tensor torch reads back from one step dir is finite."""
    from safetensors.torch import load_file

    files = [*step.rglob("*.safetensors")]
    dcp_dirs = [d for d in step.rglob("*") if d.is_dir() and (d / ".metadata").is_file()]
    return all(_all_finite(load_file(str(f))) for f in files) and all(
        _all_finite(dcp_to_dict(d, scratch)) for d in dcp_dirs
    )


@dataclass
class Outcome:
    trial: Trial
    code: int
    one_line: bool
    traceback: bool
    committed: int
    nonfinite_committed: int
    last_ok: bool  # no checkpoints, or `last` resolves to a committed step
    seconds: float


def run_trial(trial: Trial, work: Path) -> Outcome:
    work.mkdir(parents=True)
    flags = list(TINY)
    if trial.mutate is not None:
        dataset = work / "dataset"
        shutil.copytree(FIXTURE_DATASET, dataset)
        trial.mutate(dataset)
        flags = [f for f in flags if not f.startswith("--dataset.")] + [f"--dataset.root={dataset}"]
    out = work / "out"
    started = time.monotonic()
    proc = train(*flags, "--steps=6", "--save_freq=1", *trial.flags, f"--output_dir={out}", nproc=trial.nproc)
    seconds = time.monotonic() - started
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    code = proc.returncode
    if trial.nproc > 1 and code:
        codes = {int(c) for c in re.findall(r"exitcode\s*:\s*(-?\d+)", proc.stderr)}
        code = codes.pop() if len(codes) == 1 else code
    root = out / "checkpoints"
    steps = sorted(p for p in root.glob("[0-9]*") if p.is_dir()) if root.is_dir() else []
    scratch = work / "scratch"
    scratch.mkdir()
    bad = sum(not _step_finite(s, scratch) for s in steps)
    last = root / "last"
    last_ok = not steps or (last.is_symlink() and last.resolve() in [s.resolve() for s in steps])
    tracebacks = bool(worker_tracebacks(proc.stderr))
    return Outcome(trial, code, len(errors) == 1, tracebacks, len(steps), bad, last_ok, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="run only the trials whose name contains one of these")
    args = parser.parse_args(argv)
    trials = [t for t in TRIALS if not args.only or any(o in t.name for o in args.only)]
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="nonfinite-") as tmp:
        for i, trial in enumerate(trials):
            outcomes.append(run_trial(trial, Path(tmp) / f"t{i}"))
    header = (
        "| trial | source | procs | exit | one error line | traceback | committed | non-finite committed | last ok |"
    )
    print(header)
    print("|---|---|---|---|---|---|---|---|---|")
    for o in outcomes:
        print(
            f"| {o.trial.name} | {o.trial.source} | {o.trial.nproc} | {o.code} | {'yes' if o.one_line else 'no'}"
            f" | {'yes' if o.traceback else 'no'} | {o.committed} | {o.nonfinite_committed}"
            f" | {'yes' if o.last_ok else 'no'} |"
        )
    codes: dict[int, int] = {}
    for o in outcomes:
        codes[o.code] = codes.get(o.code, 0) + 1
    print(
        f"\n{len(outcomes)} trials: exit codes {dict(sorted(codes.items()))};"
        f" {sum(o.one_line and not o.traceback for o in outcomes)} ended with one error line and no traceback;"
        f" {sum(o.nonfinite_committed for o in outcomes)} non-finite checkpoints committed;"
        f" {sum(not o.last_ok for o in outcomes)} broken last; {sum(o.seconds for o in outcomes):.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
