"""One checkpoint save as a job: capture, (optionally) stage, write, commit.

A :class:`SaveJob` holds everything a checkpoint writes, captured at the step it describes:
the model and optimizer state (views of the live shards for a synchronous save, private
host copies for an asynchronous one), every rank's generator state, and the sidecar
payloads. :meth:`SaveJob.run` writes it - each rank its own DCP shards, the main rank the
gathered weights and the sidecars - into the hidden partial directory, then commits.

Where the collectives of a run go is a :class:`SaveGroups`: the training process group for a
synchronous save, a dedicated gloo group for a background one (so its collectives never
interleave with the training loop's).
"""

from __future__ import annotations

import copy
import io
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.tensor import DTensor

from ckpt_tools.errors import CheckpointError, CkptError, WriteError
from ckpt_tools.format import layout
from ckpt_tools.format.layout import CheckpointFormat, StepPaths
from ckpt_tools.format.record import TrainingStep, training_step_json
from ckpt_tools.io.fsutil import fsync_dir, fsync_tree, remove_tree, replace_symlink, sync_deferred, write_json_atomic
from ckpt_tools.io.writeback import WritebackFile
from ckpt_tools.st.writer import describe_os_error
from ckpt_tools.train.checkpoint import rng, writer_threads
from ckpt_tools.train.checkpoint.gathered_write import RowWriter, write_gathered
from ckpt_tools.train.checkpoint.state_dicts import write_flat_optimizer
from ckpt_tools.train.data.processors import Pipeline
from ckpt_tools.train.parallel.distributed import DistEnv
from ckpt_tools.train.parallel.wrap import ParallelModel
from ckpt_tools.train.policies.base import save_policy_config
from ckpt_tools.train.policies.configs import PolicyConfig


@dataclass
class SaveGroups:
    """The process groups a save's collectives run on (None: the default group)."""

    world: Any
    rows: RowWriter

    @classmethod
    def training(cls, parallel: ParallelModel, env: DistEnv) -> SaveGroups:
        return cls(world=None, rows=RowWriter.for_run(parallel, env))

    @classmethod
    def background(cls, parallel: ParallelModel, env: DistEnv) -> SaveGroups:
        """Collective: a gloo group of its own, for saves that run beside the training loop."""
        world = dist.new_group(backend="gloo") if env.distributed else None
        return cls(world=world, rows=RowWriter.for_run(parallel, env, background=True))

    def barrier(self, env: DistEnv) -> None:
        if env.distributed:
            dist.barrier(group=self.world)


@dataclass
class SaveJob:
    step: int
    root: Path  # the checkpoints directory
    final_name: str
    env: DistEnv
    fmt: CheckpointFormat
    sharded: bool
    model: dict[str, Any]  # DCP-shaped state (DTensors on sharded runs), peft-filtered
    gathered_name: str  # model.safetensors or adapter_model.safetensors
    gathered_keys: dict[str, str]  # model key → its name in the gathered file (peft drops the adapter name)
    optimizer: dict[str, Any]  # get_optimizer_state_dict output
    rng_states: dict[str, torch.Tensor] | None  # main rank only
    record: TrainingStep
    policy_config: PolicyConfig
    train_config: dict[str, Any]
    scheduler_state: dict[str, Any]
    scaler_state: dict[str, Any] | None
    processors: tuple[Pipeline, Pipeline]
    adapter_config: Any = None  # peft config, saved as adapter_config.json
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def partial(self) -> Path:
        return self.root / layout.partial_dir_name(self.final_name)

    @property
    def final(self) -> Path:
        return self.root / self.final_name

    def staged(self, host_mesh: Any, buffers: StagingBuffers) -> SaveJob:
        """A copy whose tensors are private host copies: the loop may change the live ones now.

        Sharded tensors keep their layout on ``host_mesh`` (the CPU mesh of the same shape).
        The copies land in ``buffers``, reused from one save to the next.
        """
        model = buffers.copy(("model",), self.model, host_mesh)
        optimizer = buffers.copy(("optimizer",), self.optimizer, host_mesh)
        return replace(self, model=model, optimizer=optimizer)

    def run(self, groups: SaveGroups) -> Path:
        """Collective over ``groups``: write everything into the partial dir, then commit.

        ``timings`` records how long each phase took on this rank (the benchmarks read them).
        A write that fails (full disk, file-size limit, permissions) is one :class:`WriteError`;
        the partial directory stays hidden and ``last`` unmoved.
        """
        try:
            return self._run(groups)
        except CkptError:
            raise
        except OSError as e:
            raise WriteError(
                f"checkpoint save of step {self.step}: {describe_os_error(Path(e.filename or self.partial), e)}"
            ) from None
        except dcp.CheckpointException as e:
            raise _save_error(self, e) from None

    def _run(self, groups: SaveGroups) -> Path:
        paths = StepPaths(self.partial)
        clock = PhaseClock(self.timings)
        if self.fmt.has_dcp:
            dcp_save({layout.MODEL_DCP_KEY: self.model}, paths.model_dcp, groups.world)
            clock.lap("model_dcp")
        if self.fmt.has_gathered:
            gathered = {self.gathered_keys[k]: v for k, v in self.model.items()}
            path = paths.pretrained_model / self.gathered_name
            write_gathered(gathered, path, groups.rows, lambda: groups.barrier(self.env), {"format": "pt"})
            clock.lap("gathered")
        if self.sharded:
            dcp_save({layout.OPTIMIZER_DCP_KEY: self.optimizer}, paths.optimizer_dcp, groups.world)
        elif self.env.is_main:
            with sync_deferred():  # the main rank's own files: its commit's fsync_tree syncs each once
                write_flat_optimizer(self.optimizer, paths.optimizer_state, paths.optimizer_param_groups)
        clock.lap("optimizer")
        if self.env.is_main:
            with sync_deferred():  # in the partial dir: the commit's fsync_tree syncs each file once
                self._write_sidecars(paths)
        groups.barrier(self.env)
        clock.lap("sidecars")
        if self.env.is_main:
            commit(self.partial, self.final, self.root)
        groups.barrier(self.env)
        clock.lap("commit")
        return self.final

    def _write_sidecars(self, paths: StepPaths) -> None:
        pm = paths.pretrained_model
        assert self.rng_states is not None
        rng.save_rng_states(self.rng_states, paths.rng_state, self.env.world_size)
        save_policy_config(self.policy_config, pm)
        write_json_atomic(paths.train_config, self.train_config)
        if self.adapter_config is not None:
            self.adapter_config.save_pretrained(str(pm))
        for pipeline in self.processors:
            pipeline.save(pm)
        write_json_atomic(paths.scheduler_state, self.scheduler_state)
        if self.scaler_state is not None:
            write_json_atomic(paths.scaler_state, self.scaler_state)
        # Written last: a training_step.json means everything it describes is there.
        paths.training_step.write_text(training_step_json(self.record))


def _save_error(job: SaveJob, error: dcp.CheckpointException) -> CkptError:
    """The first rank failure inside ``dcp.save``, as a one-line error (OSError: a WriteError)."""
    cause = os_error_in(error)
    if cause is not None:
        where = Path(cause.filename) if cause.filename else job.partial
        return WriteError(f"checkpoint save of step {job.step}: {describe_os_error(where, cause)}")
    last = str(error).strip().splitlines()[-1][:300] if str(error).strip() else type(error).__name__
    return CheckpointError(f"checkpoint save of step {job.step}: DCP save failed ({last})")


def os_error_in(error: BaseException) -> OSError | None:
    """The first ``OSError`` in a DCP failure: in its per-rank failures, or along their chains."""
    failures = list(getattr(error, "failures", {}).values()) or [error]
    for failure in failures:
        cause = writer_threads.root_cause(failure[0] if isinstance(failure, tuple) else failure)
        if isinstance(cause, OSError):
            return cause
    return None


def dcp_save(state: dict[str, Any], directory: Path, group: Any) -> None:
    """``dcp.save`` into ``directory``: no per-chunk CRC32, cached plans, a writer thread per free
    core, disk writeback started as the shard file grows (:class:`WritebackFileSystemWriter`).

    Each DCP chunk is a ``torch.save`` zip record; computing its CRC32 costs a large share of
    the save on CPU, and nothing ever verifies it on load (torch, accelerate and our reader
    check structure and sizes instead). Durability comes from the fsync of every file.

    The save plan (one entry per tensor chunk: ~1 000 per rank for a policy and its AdamW
    state) is the same at every save of a run, yet plain ``dcp.save`` pickles every rank's
    plan to the coordinator and the global plan back each time - a large share of the save's
    non-writing time in a profile. With plan caching each rank only says "unchanged".
    """
    from torch.utils.serialization import config

    (key,) = state  # the model or the optimizer: each keeps its own cached plan
    previous = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        writer = WritebackFileSystemWriter(directory, thread_count=writer_threads_per_rank())
        with writer_threads.watched():  # torch drops its writer threads' failures
            dcp.save(state, storage_writer=writer, planner=CachedPlanSavePlanner(key), process_group=group)
    finally:
        config.save.compute_crc32 = previous


def writer_threads_per_rank() -> int:
    """DCP writer threads for this rank: the cores each local rank has to itself, 1 to 4.

    Each thread serializes and writes its own shard file; threads beyond the free cores only
    contend (measured in docs/benchmarks.md).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, min(4, cores // local_ranks))


class WritebackFileSystem(FileSystem):
    """torch's local file system for DCP, whose new files start their disk writeback as they grow."""

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with WritebackFile(path) as stream:
            yield cast(io.IOBase, stream)


class WritebackFileSystemWriter(dcp.FileSystemWriter):
    """DCP's file writer whose shard files overlap their disk writing with their serialization.

    Plain DCP serializes a rank's whole shard file into the page cache, then fsyncs it: the
    disk idles during the copy and the copy waits during the fsync. Here the disk takes each
    32 MiB as soon as it is serialized (:mod:`ckpt_tools.io.writeback`); the files, their bytes
    and the fsync of each are those of the plain writer.
    """

    def __init__(self, path: Path, thread_count: int) -> None:
        super().__init__(path, thread_count=thread_count)
        self.fs = WritebackFileSystem()


class CachedPlanSavePlanner(DefaultSavePlanner):
    """torch's default save planner with plan caching, cached under its own key per state.

    torch keys the cache by planner class name alone; two states saved alternately (model,
    optimizer) would evict each other's plan at every save. A changed plan is detected by
    comparison and simply re-sent, so a stale cache costs one full exchange, never a wrong plan.
    """

    def __init__(self, key: str) -> None:
        super().__init__(enable_plan_caching=True)
        self._cached_plans_key = f"{type(self).__name__}:{key}"


class PhaseClock:
    """Seconds per named phase, written into ``into`` as each phase ends."""

    def __init__(self, into: dict[str, float]) -> None:
        self.into = into
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        t = time.perf_counter()
        self.into[name] = round(t - self.last, 4)
        self.last = t


class StagingBuffers:
    """Host buffers for staged copies, kept between saves.

    A fresh multi-GB allocation per save costs page faults that cost as much as the copy
    itself; reusing the previous save's buffers (free again once it committed - at most one
    save is in flight) leaves a plain memcpy. The price is that the buffers stay resident:
    one copy of this rank's model and optimizer shards, for the life of the run.
    """

    def __init__(self) -> None:
        self.tensors: dict[tuple[Any, ...], torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def copy(self, key: tuple[Any, ...], value: Any, host_mesh: Any) -> Any:
        """Deep copy of a state tree into the buffers (DTensors keep their layout on ``host_mesh``)."""
        if isinstance(value, DTensor):
            local = self._into(key, value.to_local())
            return DTensor.from_local(
                local, host_mesh, value.placements, run_check=False, shape=value.shape, stride=value.stride()
            )
        if isinstance(value, torch.Tensor):
            return self._into(key, value)
        if isinstance(value, dict):
            return {k: self.copy((*key, k), v, host_mesh) for k, v in value.items()}
        if isinstance(value, list):
            return [self.copy((*key, i), v, host_mesh) for i, v in enumerate(value)]
        return copy.deepcopy(value)

    def _into(self, key: tuple[Any, ...], tensor: torch.Tensor) -> torch.Tensor:
        source = tensor.detach()
        buffer = self.tensors.get(key)
        if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
            buffer = self.tensors[key] = torch.empty(source.shape, dtype=source.dtype, device="cpu")
        buffer.copy_(source)
        return buffer


def synced_by_their_writers(path: Path) -> bool:
    """The files each writing rank fsynced itself before the save's closing barrier.

    DCP shard files (torch's writer flushes and fsyncs each) and the gathered weights (every
    rank that wrote rows fsyncs them: on a file system shared between nodes only the writer
    can). The commit fsyncs everything else - the sidecars it deferred - and every directory,
    so each file is fsynced once. DCP's ``.metadata`` is not among them: torch fsyncs it
    before the buffered file is flushed, so the fsync may miss its bytes; the coordinator that
    wrote it is the main rank, whose commit syncs it.
    """
    if path.suffix == ".distcp":
        return True
    return path.parent.name == layout.PRETRAINED_MODEL_DIR and path.name in (
        layout.MODEL_WEIGHTS,
        layout.ADAPTER_WEIGHTS,
    )


def prepare_partial(job: SaveJob) -> None:
    """Main rank: an empty partial directory (a crashed earlier save at this step is cleared)."""
    paths = StepPaths(job.partial)
    try:
        job.root.mkdir(parents=True, exist_ok=True)
        remove_tree(job.partial)
        paths.pretrained_model.mkdir(parents=True)
        paths.training_state.mkdir()
    except OSError as e:
        where = Path(e.filename) if e.filename else job.partial
        raise WriteError(f"checkpoint save of step {job.step}: {describe_os_error(where, e)}") from None


def commit(partial: Path, final: Path, root: Path) -> None:
    """Main rank: make the partial save durable, rename it into place, then move ``last``."""
    fsync_tree(partial, already_synced=synced_by_their_writers)
    if final.exists():
        # Re-saving a step (a resume into the same output dir): swap the old one out first.
        stale = final.with_name(layout.partial_dir_name(final.name) + ".old")
        remove_tree(stale)
        os.rename(final, stale)
        os.rename(partial, final)
        replace_symlink(root / layout.LAST_LINK, final.name)
        remove_tree(stale)
    else:
        os.rename(partial, final)
        fsync_dir(root)
        replace_symlink(root / layout.LAST_LINK, final.name)
