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

import contextlib
import copy
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor

from ckpt_tools.cli.untrusted import echo
from ckpt_tools.errors import CheckpointError, CkptError, WriteError
from ckpt_tools.format import layout, manifest
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.record import TrainingStep
from ckpt_tools.format.rules import save_files
from ckpt_tools.format.rules.retention import IN_USE
from ckpt_tools.io.fsutil import fsync_dir, fsync_tree, remove_tree, replace_link_or_pointer, sync_deferred
from ckpt_tools.retention import apply_retention
from ckpt_tools.st.writer import describe_os_error
from ckpt_tools.train.checkpoint import parts
from ckpt_tools.train.checkpoint.dcp_io import os_error_in
from ckpt_tools.train.checkpoint.gathered_write import RowWriter
from ckpt_tools.train.checkpoint.written_digests import WrittenDigests, merged
from ckpt_tools.train.data.processors import Pipeline
from ckpt_tools.train.parallel.distributed import DistEnv, collective_timeout
from ckpt_tools.train.parallel.wrap import ParallelModel
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
        world = dist.new_group(backend="gloo", timeout=collective_timeout()) if env.distributed else None
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
    model: dict[str, Any]  # DCP-shaped state (DTensors on sharded runs), peft-filtered
    optimizer: dict[str, Any]  # get_optimizer_state_dict output
    rng_states: dict[str, torch.Tensor] | None  # main rank only
    record: TrainingStep  # what the checkpoint holds follows from it (manifest.Variant)
    policy_config: PolicyConfig
    train_config: dict[str, Any]
    scheduler_state: dict[str, Any]
    scaler_state: dict[str, Any] | None
    processors: tuple[Pipeline, Pipeline]
    adapter_config: Any = None  # peft config, saved as adapter_config.json
    ema_model: dict[str, Any] | None = None  # ``model`` with the EMA shadow in place of each parameter
    ema_state: dict[str, Any] | None = None  # LeRobot's ema_state.pt content (main rank, non-sharded runs)
    timings: dict[str, float] = field(default_factory=dict)
    save_id: str | None = None  # the same on every rank (the capture shares it); None: the commit makes one up
    keep_last_n: int | None = None  # --checkpoint.keep_last_n: older steps removed after the commit
    last_pointer_file: bool = False  # --checkpoint.last_link=file: `last` is always a pointer file

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
        trees = {("model",): self.model, ("optimizer",): self.optimizer}
        if self.ema_model is not None:
            trees[("ema_model",)] = self.ema_model
        if self.ema_state is not None:
            trees[("ema_state",)] = self.ema_state
        buffers.reserve(trees)
        copies = {key[0]: buffers.copy(key, tree, host_mesh) for key, tree in trees.items()}
        buffers.synchronize()  # device copies are asynchronous: done before the loop may change the state
        return replace(self, **copies)

    def run(self, groups: SaveGroups) -> Path:
        """Collective over ``groups``: write everything into the partial dir, then commit.

        ``timings`` records how long each phase took on this rank (the benchmarks read them), and
        how much of it went into the full digests of what it wrote (``digests``).
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

    @property
    def variant(self) -> manifest.Variant:
        """The run as its record describes it: the manifest's parts for it are what this job writes."""
        return manifest.Variant.of(self.record, peft=bool(self.record.peft))

    def _run(self, groups: SaveGroups) -> Path:
        paths = StepPaths(self.partial)
        clock = PhaseClock(self.timings)
        written = WrittenDigests(self.partial)
        writers = self._writers(paths, groups, written)
        todo = [writers[part.key] for part in manifest.written_parts(self.variant)]
        for phase, phase_writers in itertools.groupby(todo, key=lambda w: w.phase):
            for writer in phase_writers:
                writer.run(self.env)
            if phase == SIDECARS:
                written.dump(self.env.rank)  # before the barrier: the commit merges every rank's
                self.timings[DIGESTS] = round(written.seconds, 4)
                groups.barrier(self.env)
            clock.lap(phase)
        if self.env.is_main:
            commit(self.partial, self.final, self.root, self.save_id, pointer_file=self.last_pointer_file)
            if self.keep_last_n is not None:
                retain(self.root, self.keep_last_n)
        groups.barrier(self.env)
        clock.lap("commit")
        return self.final

    def _writers(self, paths: StepPaths, groups: SaveGroups, written: WrittenDigests) -> dict[str, PartWriter]:
        """How each part of the manifest is written, keyed by ``Part.key`` (the manifest says which are).

        The bulk writers digest what they write into ``written``; every file that can carry it
        is stamped with the save id.
        """
        save_id = self.save_id

        def barrier() -> None:
            groups.barrier(self.env)

        ema_paths = parts.EmaAsModel(paths)

        def gathered(path: Path, peft: bool) -> Callable[[], None]:
            return lambda: parts.save_gathered_weights(self.model, path, peft, groups.rows, barrier, written, save_id)

        return {
            manifest.MODEL_DCP.key: PartWriter(
                "model_dcp", True, lambda: parts.save_model_dcp(self.model, paths, groups.world, written, save_id)
            ),
            manifest.MODEL_WEIGHTS.key: PartWriter("gathered", True, gathered(paths.model_weights, False)),
            manifest.ADAPTER_WEIGHTS.key: PartWriter("gathered", True, gathered(paths.adapter_weights, True)),
            manifest.OPTIMIZER_DCP.key: PartWriter(
                "optimizer",
                True,
                lambda: parts.save_optimizer_dcp(self.optimizer, paths, groups.world, written, save_id),
            ),
            manifest.FLAT_OPTIMIZER.key: PartWriter(
                "optimizer", False, lambda: parts.save_flat_optimizer(self.optimizer, paths, save_id)
            ),
            manifest.RNG_STATE.key: PartWriter(
                SIDECARS,
                False,
                lambda: parts.save_rng_state(_given(self.rng_states), paths, self.env.world_size, save_id),
            ),
            manifest.POLICY_CONFIG.key: PartWriter(
                SIDECARS, False, lambda: parts.save_policy_config(self.policy_config, paths)
            ),
            manifest.TRAIN_CONFIG.key: PartWriter(
                SIDECARS, False, lambda: parts.save_train_config(self.train_config, paths)
            ),
            manifest.ADAPTER_CONFIG.key: PartWriter(
                SIDECARS, False, lambda: parts.save_adapter_config(_given(self.adapter_config), paths)
            ),
            manifest.PROCESSORS.key: PartWriter(SIDECARS, False, lambda: parts.save_processors(self.processors, paths)),
            manifest.SCHEDULER_STATE.key: PartWriter(
                SIDECARS, False, lambda: parts.save_scheduler_state(self.scheduler_state, paths, save_id)
            ),
            manifest.SCALER_STATE.key: PartWriter(
                SIDECARS, False, lambda: parts.save_scaler_state(_given(self.scaler_state), paths, save_id)
            ),
            manifest.EMA_DCP.key: PartWriter(
                "model_dcp",
                True,
                lambda: parts.save_model_dcp(_given(self.ema_model), ema_paths, groups.world, written, save_id),
            ),
            manifest.EMA_WEIGHTS.key: PartWriter(
                "gathered",
                True,
                lambda: parts.save_gathered_weights(
                    _given(self.ema_model), paths.ema_model_weights, False, groups.rows, barrier, written, save_id
                ),
            ),
            manifest.EMA_POLICY_CONFIG.key: PartWriter(
                SIDECARS, False, lambda: parts.save_policy_config(self.policy_config, ema_paths)
            ),
            manifest.EMA_PROCESSORS.key: PartWriter(
                SIDECARS, False, lambda: parts.save_processors(self.processors, ema_paths)
            ),
            manifest.EMA_STATE.key: PartWriter(
                SIDECARS, False, lambda: parts.save_ema_state(_given(self.ema_state), paths)
            ),
            manifest.TRAINING_STEP.key: PartWriter(
                SIDECARS, False, lambda: parts.save_training_step(self.record, paths, save_id)
            ),
        }


SIDECARS = "sidecars"  # the phase of the main rank's small files; the barrier after it ends the writing
DIGESTS = "digests"  # in ``timings``: seconds of the writing phases this rank spent on full digests (not a phase)


@dataclass(frozen=True)
class PartWriter:
    """How one part is written: by every rank (its share, collectively) or by the main rank alone."""

    phase: str  # the entry of SaveJob.timings its time counts in
    every_rank: bool
    write: Callable[[], None]

    def run(self, env: DistEnv) -> None:
        if self.every_rank:
            self.write()
        elif env.is_main:
            with sync_deferred():  # in the partial dir: the commit's fsync_tree syncs each file once
                self.write()


def _given(value: Any) -> Any:
    """A payload the record says the checkpoint holds (the capture always provides it then)."""
    assert value is not None
    return value


def _save_error(job: SaveJob, error: dcp.CheckpointException) -> CkptError:
    """The first rank failure inside ``dcp.save``, as a one-line error (OSError: a WriteError)."""
    cause = os_error_in(error)
    if cause is not None:
        where = Path(cause.filename) if cause.filename else job.partial
        return WriteError(f"checkpoint save of step {job.step}: {describe_os_error(where, cause)}")
    last = str(error).strip().splitlines()[-1][:300] if str(error).strip() else type(error).__name__
    return CheckpointError(f"checkpoint save of step {job.step}: DCP save failed ({last})")


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

    State on a CUDA device is staged into pinned (page-locked) buffers with non-blocking
    copies: a copy from device memory into pageable memory goes through a driver bounce buffer
    at a fraction of the bus speed and holds the calling thread for its whole length, while a
    pinned destination lets the DMA engine copy at full speed. The copies are queued on a
    stream of their own, so that they overlap the next step's kernels instead of queuing
    between them on the loop's (the device's default stream); that stream first waits for
    everything the loop has queued there so far, the update that produced the captured state
    among it. :meth:`synchronize`
    waits for the copies before the buffers are read or the live state may change. CPU
    tensors get plain pageable buffers and blocking copies, as before: pinning needs an
    accelerator and buys nothing for a host-to-host copy.

    The pinned buffers of a save are carved out of one allocation (:meth:`reserve`): page-locking
    is the one expensive part of the first asynchronous save, it runs beside the loop's steps
    and slows their kernel launches while it lasts, and one large allocation takes half as long
    as one per tensor (figures in docs/benchmarks.md).
    """

    ALIGN = 512  # bytes: every view in the pinned slab starts at a multiple (any dtype's alignment)

    def __init__(self) -> None:
        self.tensors: dict[tuple[Any, ...], torch.Tensor] = {}
        self._streams: dict[torch.device, Any] = {}  # per CUDA device: the stream staging copies run on
        self._pending: set[torch.device] = set()  # devices with copies queued since the last synchronize

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

    def reserve(self, trees: dict[tuple[Any, ...], Any]) -> None:
        """One pinned allocation for every device tensor of ``trees`` that has no buffer yet."""
        wanted: list[tuple[tuple[Any, ...], torch.Tensor]] = []
        for key, tree in trees.items():
            self._missing(key, tree, wanted)
        if not wanted:
            return
        offsets, total = [], 0
        for _, tensor in wanted:
            offsets.append(total)
            total += -(-tensor.nbytes // self.ALIGN) * self.ALIGN
        use_parallel_pinning()
        slab = torch.empty(total, dtype=torch.uint8, device="cpu", pin_memory=True)
        for (key, tensor), offset in zip(wanted, offsets, strict=True):
            view = slab[offset : offset + tensor.nbytes].view(tensor.dtype).view(tensor.shape)
            self.tensors[key] = view

    def _missing(self, key: tuple[Any, ...], value: Any, out: list[tuple[tuple[Any, ...], torch.Tensor]]) -> None:
        """The device tensors under ``value`` whose buffer is absent or of another shape (keys as :meth:`copy` makes them)."""
        if isinstance(value, DTensor):
            value = value.to_local()
        if isinstance(value, torch.Tensor):
            buffer = self.tensors.get(key)
            fits = buffer is not None and buffer.shape == value.shape and buffer.dtype == value.dtype
            if value.device.type == "cuda" and not fits and value.nbytes:
                out.append((key, value))
        elif isinstance(value, dict):
            for k, v in value.items():
                self._missing((*key, k), v, out)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                self._missing((*key, i), v, out)

    def synchronize(self) -> None:
        """Wait until every queued device-to-host copy has landed (nothing to wait for on CPU).

        Only the calling thread (the background save's) waits, and only for the staging streams.
        """
        for device in self._pending:
            self._streams[device].synchronize()
        self._pending.clear()

    def _staging_stream(self, device: torch.device) -> Any:
        """``device``'s staging stream, made to wait for the work the loop queued on the default
        stream so far (once per staging pass: the update that produced the captured state is among it)."""
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        if device not in self._pending:
            stream.wait_stream(torch.cuda.default_stream(device))
            self._pending.add(device)
        return stream

    def _into(self, key: tuple[Any, ...], tensor: torch.Tensor) -> torch.Tensor:
        source = tensor.detach()
        on_cuda = source.device.type == "cuda"
        buffer = self.tensors.get(key)
        if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
            buffer = self.tensors[key] = torch.empty(source.shape, dtype=source.dtype, device="cpu", pin_memory=on_cuda)
        if on_cuda:
            with torch.cuda.stream(self._staging_stream(source.device)):
                buffer.copy_(source, non_blocking=True)
        else:
            buffer.copy_(source)
        return buffer


PINNING_THREADS = 16  # threads page-locking a new pinned allocation (a power of two, as torch requires)


def use_parallel_pinning() -> None:
    """Page-lock new pinned memory with several threads (``cudaHostRegister``), unless the user chose.

    torch's default, one ``cudaHostAlloc``, page-locks a 3 GiB staging slab in 1.6-2.8 s on an
    H200 host while the loop's kernel launches slow to a fraction beside it; registering the
    pages from 16 threads takes 0.5 s (docs/benchmarks.md). A ``PYTORCH_CUDA_ALLOC_CONF`` that
    names any ``pinned_`` option is the user's choice and is left alone; a torch without the
    setting keeps its default.
    """
    if "pinned_" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        return
    threads = max(1, min(PINNING_THREADS, os.cpu_count() or 1))
    threads = 1 << (threads.bit_length() - 1)
    setting = f"pinned_use_cuda_host_register:True,pinned_num_register_threads:{threads}"
    # torch >= 2.10 names it per accelerator; older ones only under torch.cuda (deprecated since).
    apply = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
    with contextlib.suppress(AttributeError, RuntimeError):  # a torch without the setting: its default
        apply(setting)


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
    return path.parent.name in (layout.PRETRAINED_MODEL_DIR, layout.PRETRAINED_MODEL_EMA_DIR) and path.name in (
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
        if job.ema_model is not None:
            paths.pretrained_model_ema.mkdir()
    except OSError as e:
        where = Path(e.filename) if e.filename else job.partial
        raise WriteError(f"checkpoint save of step {job.step}: {describe_os_error(where, e)}") from None


def retain(root: Path, keep_last_n: int) -> None:
    """Main rank, once a save is committed (in the background thread for an asynchronous one): remove the
    steps ``--checkpoint.keep_last_n`` lets go (:mod:`ckpt_tools.retention`), and say what it did.

    The run owns its output dir, and this runs between the commit and the next save, so no save
    of this run is using an older step. A removal that fails is a warning: the checkpoint just
    committed is complete, and the run goes on (a later retention, or ``ckpt-tools prune``, retries).
    """
    try:
        outcome = apply_retention(root, keep_last_n)
    except (CkptError, OSError) as e:
        echo(f"warning: checkpoint retention (--checkpoint.keep_last_n={keep_last_n}) failed: {e}")
        return
    for note in outcome.notes:
        echo(f"checkpoint retention: {note}")
    if outcome.removed:
        names = ", ".join(layout.step_dir_name(n) for n in outcome.removed)
        echo(f"checkpoint retention (--checkpoint.keep_last_n={keep_last_n}): removed {names}")
    held = [f.step for f in outcome.plan.kept if IN_USE in f.reasons] + outcome.taken_meanwhile
    if held:
        names = ", ".join(layout.step_dir_name(n) for n in sorted(held))
        echo(f"checkpoint retention: kept {names}, in use by a reader")


def commit(partial: Path, final: Path, root: Path, save_id: str | None = None, *, pointer_file: bool = False) -> None:
    """Main rank: record the save's files, make the partial save durable, rename it into place, then move ``last``.

    Every rank's files are complete (the closing barrier): the record lists them all, so a file
    that later arrives from another save is told apart (:mod:`ckpt_tools.format.rules.save_files`),
    with the full digests every rank computed as it wrote (:mod:`.written_digests`).
    """
    paths = StepPaths(partial)
    save_files.write_record(paths, save_id, merged(partial))  # fsynced below
    fsync_tree(partial, already_synced=synced_by_their_writers)
    if final.exists():
        # Re-saving a step (a resume into the same output dir): swap the old one out first.
        stale = final.with_name(layout.partial_dir_name(final.name) + ".old")
        remove_tree(stale)
        os.rename(final, stale)
        os.rename(partial, final)
        replace_link_or_pointer(root / layout.LAST_LINK, final.name, pointer_file=pointer_file)
        remove_tree(stale)
    else:
        os.rename(partial, final)
        fsync_dir(root)
        replace_link_or_pointer(root / layout.LAST_LINK, final.name, pointer_file=pointer_file)
