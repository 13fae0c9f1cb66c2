"""A fuzz campaign: hypothesis picks (seed checkpoint, mutation family, mutation seed) triples.

Shared by the CI test (few examples, derandomized, fails on the first bad case and shrinks it)
and ``bin/reliability-report`` (many examples, a recorded seed, counts everything and never
stops). Every example is reproducible from its triple alone: ``run_case(seeds[i], family,
rng_seed, workdir)``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from devtools.procs import REPO
from devtools.reliability import fuzz_hostile, fuzz_races
from devtools.reliability.fuzz_mutations import FAMILIES, MODEL_DCP
from devtools.reliability.fuzz_runner import CaseResult, Seed, run_case
from devtools.training import LEGACY_CHECKPOINT

# The families judged by what the commands print and by the files around them (docs/reliability.md,
# "Hostile strings, hostile numbers, races"): run by :func:`campaign` only when named.
OUTPUT_FAMILIES: dict[str, Callable[..., CaseResult]] = {
    **{name: fuzz_hostile.run_hostile_case for name in fuzz_hostile.FAMILIES},
    **{name: fuzz_races.run_race_case for name in fuzz_races.SCENARIOS},
}
ALL_FAMILIES = sorted(FAMILIES) + sorted(OUTPUT_FAMILIES)
# Checked-in checkpoints (no training needed): LeRobot main's FSDP and HSDP DCP runs, its
# single-process run, and the 0.6.x golden one. The race families use those with DCP shards.
FIXTURE_SEEDS = {
    "lerobot-fsdp": REPO / "fixtures/lerobot/main/fsdp-dcp/checkpoints/000004",
    "lerobot-hsdp": REPO / "fixtures/lerobot/main/hsdp-dcp/checkpoints/000004",
    "lerobot-single": REPO / "fixtures/lerobot/main/single/checkpoints/000004",
    "legacy": LEGACY_CHECKPOINT,
}


def fixture_seeds(names: Sequence[str] | None = None) -> list[Seed]:
    """The checked-in seeds (all, or ``names``), without reference conversions (the output families make their own)."""
    return [Seed(name, path, {}) for name, path in FIXTURE_SEEDS.items() if names is None or name in names]


def _seed_for(seeds: Sequence[Seed], index: int, family: str) -> Seed:
    """``seeds[index]``, or for a race family the next seed with model DCP shards (races convert them)."""
    if family not in fuzz_races.SCENARIOS:
        return seeds[index]
    for k in range(len(seeds)):
        seed = seeds[(index + k) % len(seeds)]
        if (seed.step_dir / MODEL_DCP / ".metadata").is_file():
            return seed
    raise ValueError("the race families need a seed with model DCP shards (lerobot-fsdp, lerobot-hsdp, fsdp, hsdp)")


EXAMPLES_ENV = "CKPT_FUZZ_EXAMPLES"
SEED_ENV = "CKPT_FUZZ_SEED"


def examples_from_env(default: int) -> int:
    return int(os.environ.get(EXAMPLES_ENV, default))


def campaign(
    seeds: Sequence[Seed],
    examples: int,
    workdir: Path,
    on_result: Callable[[CaseResult], None],
    *,
    seed: int | None = None,
    shrink: bool = True,
    timeout: float = 60.0,
    families: Sequence[str] | None = None,
) -> None:
    """Run ``examples`` cases; ``seed`` None means derandomized (the same cases every run).

    ``families``: only these families (default: every reader family of :data:`FAMILIES`; the
    :data:`OUTPUT_FAMILIES` run when named).
    """
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=seed is None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        st.integers(0, len(seeds) - 1),
        st.sampled_from(sorted(families or FAMILIES)),
        st.integers(0, 2**31 - 1),
    )
    def one(index: int, family: str, rng_seed: int) -> None:
        runner = OUTPUT_FAMILIES.get(family, run_case)
        on_result(runner(_seed_for(seeds, index, family), family, rng_seed, workdir, timeout=timeout))

    if seed is not None:
        one = hypothesis_seed(seed)(one)
    one()


@dataclass
class FuzzTally:
    """Counts for the report: cases, outcomes per reader, and every kind of violation."""

    cases: int = 0
    reader_runs: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    by_family: Counter[str] = field(default_factory=Counter)
    tracebacks: int = 0  # reader raised something other than a one-line CkptError
    hangs: int = 0
    crashes: int = 0
    memory_cap_hits: int = 0
    code_executions: int = 0
    mutated_processes: int = 0  # a reader's load changed a shared object (a stand-in, pathlib, a dtype table)
    outside_writes: int = 0
    sources_deleted: int = 0
    wrong_accepts: int = 0  # a reader succeeded where it must refuse, or converted wrong bytes
    raw_outputs: int = 0  # human output with a raw control character (hostile strings)
    bad_exits: int = 0  # an exit code that is not documented, or not the one the interleaving calls for
    files_lost: int = 0  # a file that existed before the case (an output, a shard, a planted file) is gone
    files_replaced: int = 0  # ... or holds other bytes
    locks_left: int = 0
    temporaries_left: int = 0
    violations: list[str] = field(default_factory=list)

    def add(self, result: CaseResult) -> None:
        self.cases += 1
        self.by_family[result.family] += 1
        for r in result.readers.values():
            self.reader_runs += 1
            self.by_status[r.get("status", "?")] += 1
        self.tracebacks += sum(r.get("status") == "bug" for r in result.readers.values())
        self.tracebacks += sum("traceback" in v or "without exactly one" in v for v in result.violations)
        self.memory_cap_hits += sum(r.get("status") == "memory" for r in result.readers.values())
        self.hangs += result.child == "timeout" or any("not bounded by its size" in v for v in result.violations)
        self.crashes += result.child == "crash"
        self.code_executions += result.code_executed
        self.mutated_processes += bool(result.process_changes)
        self.outside_writes += len(result.outside_writes)
        self.sources_deleted += len(result.sources_deleted)
        self.wrong_accepts += sum(("must refuse" in v or "different bytes" in v) for v in result.violations)
        self.raw_outputs += bool(result.raw_outputs)
        self.bad_exits += bool(result.bad_exits)
        self.files_lost += len(result.files_lost)
        self.files_replaced += len(result.files_replaced)
        self.locks_left += len(result.locks_left)
        self.temporaries_left += len(result.temporaries_left)
        if result.violations:
            head = f"[{result.seed} {result.family} {result.target}] {result.detail}"
            self.violations.append(head + "\n    " + "\n    ".join(v[:800] for v in result.violations))
