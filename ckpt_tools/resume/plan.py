"""``plan_reshard``: what resuming a checkpoint on another topology will do, before it runs.

From ``training_step.json``, ``train_config.json``, DCP ``.metadata`` and safetensors headers -
never tensor data - it predicts, for every rank of the target topology:

- the bytes it reads from each file: for DCP inputs, exactly the spans torch's loader requests
  (:mod:`ckpt_tools.resume.reads`); safetensors and JSON inputs are read whole by every rank;
- the bytes it then holds for parameters, gradients and optimizer state, under FSDP2's
  placement rule (:mod:`ckpt_tools.resume.placement`);

plus the batch factorization before and after, whether the data order stays sample-exact,
where the sampler resumes, a linear-scaling suggestion for the learning rate and steps (never
applied), and what cannot work and why (the failed checks of :mod:`ckpt_tools.resume.checks`,
the same :class:`~ckpt_tools.check.Check` results ``verify-resume`` reports).

``ReshardPlan.to_dict`` (what ``reshard-plan --json`` prints) holds every field of the plan
plus ``workable``, per rank ``read_bytes`` and ``resident.total``, per batch
``effective_batch_size`` and ``samples_per_step``; ``blockers`` and ``warnings`` are lists of
checks shaped ``{"name", "status", "message"}``, as in ``verify-resume`` and ``inspect``.
The resume audit the training core writes (``resume_audit/rank<R>.json``) is the measured side
of the same numbers; the tests hold one against the other.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from ckpt_tools.check import FAIL, WARN, Check
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.format import manifest
from ckpt_tools.format.layout import resolve_step
from ckpt_tools.format.peft_keys import PEFT_MODEL_PREFIX
from ckpt_tools.format.record import BatchFactorization, Topology
from ckpt_tools.format.rules.data_order import DataOrderChange
from ckpt_tools.format.rules.ignored_modules import ignored_regex, parameter_is_ignored
from ckpt_tools.format.rules.resumable import Trainer
from ckpt_tools.format.rules.scaling import linear_scaling
from ckpt_tools.resume.checks import resume_checks
from ckpt_tools.resume.placement import coordinates, dim0_breaks_of, local_rows
from ckpt_tools.resume.reads import Wanted, count_reads
from ckpt_tools.resume.source import ResumeSource, SavedTensor, load_source
from ckpt_tools.resume.target import ResumeTarget, TargetRequest, resolve_target
from ckpt_tools.st.dtypes import numel
from ckpt_tools.units import interval_ranges

DCP_CHUNKS, WHOLE_FILE = "dcp-chunks", "whole-file"
RANKS_LISTED = 1024  # larger worlds are described by rank groups only (each rank's entry would be a copy)


@dataclass(frozen=True)
class FileRead:
    path: str  # relative to the step dir; absolute for files outside it (a PEFT base model)
    bytes: int
    requests: int
    how: str  # dcp-chunks: spans requested through DCP's FileSystemReader; whole-file: read entirely
    role: str  # weights | optimizer | state | base


@dataclass(frozen=True)
class Resident:
    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


@dataclass(frozen=True)
class RankPlan:
    rank: int
    replica: int  # coordinate on dp_replicate
    shard: int  # coordinate on dp_shard
    node: int | None
    reads: tuple[FileRead, ...]
    resident: Resident
    resident_complete: bool = True  # False: a PEFT base whose shapes could not be read

    @property
    def read_bytes(self) -> int:
        return sum(r.bytes for r in self.reads)

    def dcp_reads(self) -> dict[str, int]:
        """Bytes per DCP shard file: what ``resume_audit/rank<R>.json`` records under ``read``."""
        return {r.path: r.bytes for r in self.reads if r.how == DCP_CHUNKS}

    def role_bytes(self, role: str) -> int:
        return sum(r.bytes for r in self.reads if r.role == role)


@dataclass(frozen=True)
class RankGroup:
    """Ranks that read the same and hold the same: by ``dp_shard`` index, on every replica.

    ``shards`` are half-open ranges of shard indices; rank ``r`` belongs to the group when
    ``r % dp_shard`` falls in one of them (rank = replica × dp_shard + shard).
    """

    shards: tuple[tuple[int, int], ...]
    replicas: int
    dp_shard: int
    reads: tuple[FileRead, ...]
    resident: Resident
    complete: bool = True  # False: a PEFT base whose shapes could not be read

    @property
    def count(self) -> int:
        """How many ranks the group holds."""
        return self.replicas * sum(hi - lo for lo, hi in self.shards)

    @property
    def read_bytes(self) -> int:
        return sum(r.bytes for r in self.reads)

    def role_bytes(self, role: str) -> int:
        return sum(r.bytes for r in self.reads if r.role == role)

    def describe_ranks(self) -> str:
        return describe_ranks(self.shards, self.replicas, self.dp_shard)


def describe_ranks(shards: Iterable[tuple[int, int]], replicas: int, dp_shard: int) -> str:
    """The ranks at ``shards`` (half-open shard-index ranges) on every replica: ``0-3,8``, or - for a
    replicated mesh too big to spell rank by rank - ``shard 0-3 of each of the 1000 replicas``."""
    shards = sorted(shards)
    if replicas == 1:
        return interval_ranges(shards)
    if replicas * sum(hi - lo for lo, hi in shards) <= RANKS_LISTED:
        return interval_ranges(
            sorted((rep * dp_shard + lo, rep * dp_shard + hi) for rep in range(replicas) for lo, hi in shards)
        )
    return f"shard {interval_ranges(shards)} of each of the {replicas} replicas"


@dataclass(frozen=True)
class TopologyInfo:
    world_size: int
    dp_replicate: int
    dp_shard: int
    layout: str
    nnodes: int | None
    description: str

    @classmethod
    def of(cls, t: Topology) -> TopologyInfo:
        return cls(t.world_size, t.dp_replicate, t.dp_shard, t.layout.value, t.nnodes, t.describe())


@dataclass(frozen=True)
class DataOrder:
    sample_exact: bool
    samples_seen: int | None
    epoch: int | None
    offset: int | None
    dataset_size: int | None
    seed: int | None
    explanation: str


@dataclass(frozen=True)
class Suggestion:
    """Linear scaling: keep lr / effective batch and the remaining samples. Never applied."""

    lr_before: float | None
    lr_after: float | None
    steps_before: int | None
    steps_after: int | None
    remaining_samples: int | None
    explanation: str


@dataclass
class ReshardPlan:
    checkpoint: str
    step: int
    source: TopologyInfo | None
    target: TopologyInfo | None
    target_world_size: int
    weights: str | None  # which input the resume loads weights from
    optimizer: str | None
    trainer: str = Trainer.CKPT_TRAIN.value  # whose resume is predicted (ckpt-train or lerobot-train)
    ranks: list[RankPlan] = field(default_factory=list)  # one per rank, up to RANKS_LISTED ranks
    rank_groups: list[RankGroup] = field(default_factory=list)  # every rank, by identical prediction
    batch_before: BatchFactorization | None = None
    batch_after: BatchFactorization | None = None
    data: DataOrder | None = None
    suggestion: Suggestion | None = None
    blockers: list[Check] = field(default_factory=list)  # the failed resume checks: what cannot work, and why
    warnings: list[Check] = field(default_factory=list)  # the warned ones: what the resume changes
    notes: list[str] = field(default_factory=list)

    @property
    def workable(self) -> bool:
        return not self.blockers

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["workable"] = self.workable
        for rank, plan in zip(out["ranks"], self.ranks, strict=True):
            rank["read_bytes"] = plan.read_bytes
            rank["resident"]["total"] = plan.resident.total
        for group, grouped in zip(out["rank_groups"], self.rank_groups, strict=True):
            group["ranks"] = grouped.describe_ranks()
            group["count"] = grouped.count
            group["read_bytes"] = grouped.read_bytes
            group["resident"]["total"] = grouped.resident.total
        for key in ("batch_before", "batch_after"):
            info = getattr(self, key)
            if info is not None:
                out[key]["effective_batch_size"] = info.effective_batch_size
                out[key]["samples_per_step"] = info.samples_per_step
        return out


# ====================================================================== entry point


def plan_reshard(checkpoint: str | os.PathLike[str], request: TargetRequest | None = None) -> ReshardPlan:
    """Plan a resume of ``checkpoint`` as ``request`` describes it (None: on the saved topology).

    ``request`` holds the resume command's overrides, e.g. ``TargetRequest(nproc=4,
    dp_replicate=2, dp_shard=2)``; what it leaves None keeps the saved config's value. Raises
    :class:`~ckpt_tools.errors.UsageError` for values that can never work and
    :class:`~ckpt_tools.errors.CheckpointError` when the path is not a checkpoint or its
    ``training_step.json`` is unreadable; everything else that stands in the way of the resume
    is listed in ``blockers``.
    """
    request = request or TargetRequest()
    request.check()
    paths = resolve_step(checkpoint)
    source = load_source(paths)
    target = resolve_target(source.config, source.record, request, paths=source.paths, trainer=source.trainer)
    return build_plan(source, target)


def build_plan(source: ResumeSource, target: ResumeTarget) -> ReshardPlan:
    record = source.record
    plan = ReshardPlan(
        checkpoint=str(source.paths.root),
        step=record.step,
        source=TopologyInfo.of(record.topology) if record.topology else None,
        target=TopologyInfo.of(target.topology) if target.topology else None,
        target_world_size=target.world_size,
        weights=_describe(source, source.weights.path if source.weights else None),
        optimizer=_describe(source, source.optimizer.path if source.optimizer else None),
        trainer=target.trainer.value,
        notes=list(source.notes),
    )
    checks = resume_checks(source, target)
    plan.blockers = [c for c in checks if c.status == FAIL]
    plan.warnings = [c for c in checks if c.status == WARN]
    plan.batch_before = _batch(record.batch_size, record.dp_world_size, record.grad_accum_steps)
    # Every process is a data-parallel worker: dp_world_size is the world size, whatever R and S.
    plan.batch_after = _batch(target.batch_size, target.world_size, target.grad_accum_steps)
    if target.topology is not None:
        plan.rank_groups = rank_groups(source, target.topology, target)
        if target.topology.world_size <= RANKS_LISTED:
            plan.ranks = rank_plans(plan.rank_groups, target.topology)
        else:
            plan.notes.append(
                f"{target.topology.world_size} ranks: the prediction is listed by groups of ranks that read and"
                f" hold the same (rank_groups), not rank by rank (up to {RANKS_LISTED} ranks)"
            )
        plan.notes += _node_notes(target.topology)
    plan.data = _data_order(source, plan.batch_before, plan.batch_after)
    plan.suggestion = _suggest(source, plan.batch_before, plan.batch_after)
    return plan


def _describe(source: ResumeSource, path: Path | None) -> str | None:
    if path is None:
        return None
    rel = str(path.relative_to(source.paths.root)) if path.is_relative_to(source.paths.root) else str(path)
    return f"{rel} ({'DCP shards' if path.is_dir() else 'safetensors'})"


def _batch(batch: int | None, world: int | None, accum: int | None) -> BatchFactorization | None:
    if batch is None or world is None or accum is None:
        return None
    return BatchFactorization(batch, world, accum)


# ====================================================================== per rank


@dataclass(frozen=True)
class _Placement:
    """Which tensors FSDP shards on the target (all parameters but ``ignored_modules``) and the boxes."""

    topology: Topology
    sharded: dict[str, bool]  # parameter name -> managed (sharded) by fully_shard
    frozen_sharded: dict[str, bool]

    @classmethod
    def of(cls, source: ResumeSource, topology: Topology) -> _Placement:
        regex = ignored_regex(source.config.ignored_modules if source.config else None)
        # A LeRobot model state holds its buffers too: fully_shard shards parameters only.
        buffers = set(source.params) - source.trainable if source.trainer is Trainer.LEROBOT else set()
        return cls(
            topology,
            {name: name not in buffers and not parameter_is_ignored(name, regex) for name in source.params},
            {name: not parameter_is_ignored(name, regex, PEFT_MODEL_PREFIX) for name in source.frozen},
        )

    def param_sharded(self, spec: SavedTensor, *, frozen: bool = False) -> bool:
        return (self.frozen_sharded if frozen else self.sharded).get(spec.name, True)

    def slot_sharded(self, param: SavedTensor | None, spec: SavedTensor) -> bool:
        """Optimizer state is created ``zeros_like(param)``: sharded like it; 0-d ``step`` is whole."""
        return (
            param is not None and self.sharded.get(param.name, True) and spec.shape == param.shape and spec.shape != ()
        )

    def rows(self, spec: SavedTensor, sharded: bool, shards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Along dim 0, (offset, rows) each of ``shards`` holds of ``spec``."""
        return local_rows(spec.shape, self.topology, shards, sharded=sharded)

    def nbytes(self, spec: SavedTensor, sharded: bool, shards: np.ndarray) -> np.ndarray:
        """Bytes of ``spec`` each of ``shards`` holds."""
        _, rows = self.rows(spec, sharded, shards)
        per_row = numel(spec.shape[1:]) if spec.shape else 1
        return rows * (per_row * spec.itemsize)


def rank_groups(source: ResumeSource, topology: Topology, target: ResumeTarget) -> list[RankGroup]:
    """Reads and resident bytes of every rank of ``topology``, as groups of ranks that share them.

    A rank's reads and placement depend only on its ``dp_shard`` index (replicas of a shard hold
    and read the same), and along the shard indices they change only at the few indices
    :func:`~ckpt_tools.resume.placement.dim0_breaks` names. So one shard per interval between
    those indices is evaluated, all of them at once in columns (:mod:`ckpt_tools.resume.reads`):
    the work grows with the tensors and saved chunks, not with the world size (a plan for a
    million processes costs what one for a hundred does).
    """
    place = _Placement.of(source, topology)
    whole = tuple(_whole_file_reads(source, target))
    complete = not (source.peft and not source.frozen)
    shards = topology.dp_shard if topology.layout.sharded else 1
    bounds = sorted(_shard_breaks(source, shards) | {0, shards})
    intervals = list(itertools.pairwise(bounds))
    reps = np.asarray([lo for lo, _ in intervals], dtype=np.int64)
    reads: list[list[FileRead]] = [[] for _ in intervals]
    if source.weights is not None and source.weights.index is not None:
        specs = [(spec, place.param_sharded(spec)) for spec in source.params.values()]
        _add_dcp_reads(reads, source, source.weights.index, specs, place, reps, "weights")
    if source.optimizer is not None and source.optimizer.index is not None:
        specs = [
            (spec, place.slot_sharded(source.param_of(name), spec))
            for name, slots in source.optimizer_state.items()
            for spec in slots.values()
        ]
        _add_dcp_reads(reads, source, source.optimizer.index, specs, place, reps, "optimizer")
    resident = _resident(source, place, reps)
    groups: dict[tuple[tuple[FileRead, ...], Resident], list[tuple[int, int]]] = {}
    for k, (lo, hi) in enumerate(intervals):
        spans = groups.setdefault(((*reads[k], *whole), resident[k]), [])
        if spans and spans[-1][1] == lo:
            spans[-1] = (spans[-1][0], hi)  # adjacent shards with the same prediction
        else:
            spans.append((lo, hi))
    return [
        RankGroup(tuple(spans), topology.dp_replicate, shards, group_reads, group_resident, complete)
        for (group_reads, group_resident), spans in groups.items()
    ]


def rank_plans(groups: list[RankGroup], topology: Topology) -> list[RankPlan]:
    """One :class:`RankPlan` per rank, in rank order (for worlds of at most :data:`RANKS_LISTED`)."""
    by_shard: dict[int, RankGroup] = {}
    for group in groups:
        for lo, hi in group.shards:
            by_shard.update(dict.fromkeys(range(lo, hi), group))
    shards = topology.dp_shard if topology.layout.sharded else 1
    out = []
    for coord in coordinates(topology):
        group = by_shard[coord.rank % shards]
        out.append(
            RankPlan(coord.rank, coord.replica, coord.shard, coord.node, group.reads, group.resident, group.complete)
        )
    return out


def _shard_breaks(source: ResumeSource, shards: int) -> set[int]:
    """Every shard index at which some tensor's local box or saved-chunk overlaps can change."""
    if shards <= 1:
        return set()
    found: list[np.ndarray] = []
    optimizer = [spec for slots in source.optimizer_state.values() for spec in slots.values()]
    for specs, container in (
        (list(source.params.values()), source.weights),
        (list(source.frozen.values()), None),
        (optimizer, source.optimizer),
    ):
        table = container.index.table if container is not None and container.index is not None else None
        for spec in specs:
            if not spec.shape:
                continue
            t = table.tensor_id(spec.key) if table is not None else None
            starts, stops = _EMPTY, _EMPTY
            if table is not None and t is not None:
                rows = table.rows_of(t)
                stored = table.file[rows] >= 0
                starts = table.offsets[rows, 0][stored]
                stops = starts + table.sizes[rows, 0][stored]
            found.append(dim0_breaks_of(spec.shape[0], shards, starts, stops))
    return set(np.unique(np.concatenate(found)).tolist()) if found else set()


_EMPTY = np.zeros(0, dtype=np.int64)


def _add_dcp_reads(
    reads: list[list[FileRead]],
    source: ResumeSource,
    index: ChunkIndex,
    specs: list[tuple[SavedTensor, bool]],
    place: _Placement,
    reps: np.ndarray,
    role: str,
) -> None:
    """Append each interval's reads from one DCP directory (one :class:`FileRead` per file)."""
    table = index.table
    wanted = []
    for spec, sharded in specs:
        t = table.tensor_id(spec.key)
        if t is not None:
            start, rows = place.rows(spec, sharded, reps)
            wanted.append(Wanted(t, start, rows))
    totals = count_reads(table, wanted, len(reps), byte_items=True)
    prefix = str(index.root.relative_to(source.paths.root))
    byte_files = [b.file or "" for b in table.byte_items]
    shown: dict[str, str] = {}  # file name -> its path from the step dir (built once, not once per rank)
    for k in range(len(reps)):
        per_file = totals.of_shard(k, table.files, byte_files)
        for file, (nbytes, requests) in sorted(per_file.items()):
            path = shown.get(file)
            if path is None:
                path = shown[file] = str(PurePosixPath(prefix) / file) if "/" in file else f"{prefix}/{file}"
            reads[k].append(FileRead(path, nbytes, requests, DCP_CHUNKS, role))


def _whole_file_reads(source: ResumeSource, target: ResumeTarget) -> list[FileRead]:
    """Files every rank reads entirely: flat weights / optimizer, the base model, the state the resume restores."""
    paths, files = source.paths, []
    for container, role in ((source.weights, "weights"), (source.optimizer, "optimizer")):
        if container is not None and container.header is not None:
            files += [(path, role) for path in container.part.paths(paths)]
    if source.base_weights is not None:
        files.append((source.base_weights, "base"))
    resume = manifest.Resume.at(source.paths, source.record, target.world_size, target.mixed_precision)
    files += [(path, "state") for part in manifest.resume_reads(resume) for path in part.paths(paths)]
    out = []
    for path, role in files:
        try:
            size = path.stat().st_size
        except OSError:
            continue  # missing: a blocker says so
        rel = str(path.relative_to(paths.root)) if path.is_relative_to(paths.root) else str(path)
        out.append(FileRead(rel, size, 1, WHOLE_FILE, role))
    return out


def _resident(source: ResumeSource, place: _Placement, reps: np.ndarray) -> list[Resident]:
    """Local bytes after the load, per shard in ``reps``: every parameter (PEFT: the frozen base too),
    the trainable ones' gradients, and the optimizer state of parameters the model has."""
    zero = np.zeros(reps.shape, dtype=np.int64)
    params = zero.copy()
    for spec in source.params.values():
        params += place.nbytes(spec, place.param_sharded(spec), reps)
    for spec in source.frozen.values():
        params += place.nbytes(spec, place.param_sharded(spec, frozen=True), reps)
    if source.positional:
        # LeRobot's unsharded state, keyed by position: held whole (it never loads into a sharded
        # run), and each parameter's gradient has the shape and dtype of its exp_avg.
        slots_of = list(source.optimizer_state.values())
        grads = sum(slots["exp_avg"].nbytes for slots in slots_of if "exp_avg" in slots)
        held = sum(spec.nbytes for slots in slots_of for spec in slots.values())
        return [Resident(int(p), grads, held) for p in params]
    grads_by_shard = zero.copy()
    for name in source.trainable:
        spec = source.params[name]
        grads_by_shard += place.nbytes(spec, place.param_sharded(spec), reps)
    optimizer = zero.copy()
    for name, slots in source.optimizer_state.items():
        param = source.param_of(name)
        if param is not None:
            for spec in slots.values():
                optimizer += place.nbytes(spec, place.slot_sharded(param, spec), reps)
    return [Resident(int(p), int(g), int(o)) for p, g, o in zip(params, grads_by_shard, optimizer, strict=True)]


def _node_notes(topology: Topology) -> list[str]:
    if not topology.nnodes or topology.nnodes == 1 or not topology.layout.sharded:
        return []
    per_node = topology.world_size // topology.nnodes
    if per_node % topology.dp_shard == 0:
        return [f"each dp_shard group ({topology.dp_shard} ranks) stays inside one node of {per_node} processes"]
    return [
        f"dp_shard groups of {topology.dp_shard} ranks span nodes of {per_node} processes: every all-gather and"
        " reduce-scatter crosses the network (HSDP with dp_shard dividing the processes per node keeps them local)"
    ]


# ====================================================================== data order and scaling


def _data_order(source: ResumeSource, before: BatchFactorization | None, after: BatchFactorization | None) -> DataOrder:
    record = source.record
    sampler = record.sampler
    change = DataOrderChange(
        before.dp_world_size if before else None,
        before.batch_size if before else None,
        after.dp_world_size if after else None,
        after.batch_size if after else None,
    )
    where = ""
    if sampler is not None:
        where = f"the sampler resumes at epoch {sampler.epoch}, offset {sampler.offset}"
        if sampler.dataset_size:
            where += f" of {sampler.dataset_size}"
        where += f" (samples_seen {record.samples_seen}, seed {sampler.seed})"
    why = change.describe()
    return DataOrder(
        sample_exact=change.sample_exact is True,
        samples_seen=record.samples_seen,
        epoch=sampler.epoch if sampler else None,
        offset=sampler.offset if sampler else None,
        dataset_size=sampler.dataset_size if sampler else None,
        seed=sampler.seed if sampler else None,
        explanation=f"{why}; {where}" if where else why,
    )


def _suggest(
    source: ResumeSource, before: BatchFactorization | None, after: BatchFactorization | None
) -> Suggestion | None:
    if before is None or after is None:
        return None
    config = source.config
    scaling = linear_scaling(
        before, after, lr=config.lr if config else None, steps=config.steps if config else None, step=source.record.step
    )
    if scaling.unchanged:
        text = "nothing to adjust: the effective batch and the samples per step are unchanged"
    else:
        suggested = scaling.describe()
        text = f"{suggested}; never applied automatically" if suggested else ""
    return Suggestion(
        scaling.lr_before,
        scaling.lr_after,
        scaling.steps_before,
        scaling.steps_after,
        scaling.remaining_samples,
        text,
    )


__all__ = [
    "DataOrder",
    "FileRead",
    "RankGroup",
    "RankPlan",
    "ReshardPlan",
    "Resident",
    "Suggestion",
    "plan_reshard",
]
