"""The checkpoint life cycle: collective save, atomic commit, ``last``, and resume.

One object owns it. A save is collective - every rank enters; each rank writes its own DCP
shards in parallel, while gathered weights and every sidecar file are written by the main
rank alone. Everything goes into a hidden ``.NNNNNN.partial`` directory; only when all
ranks are done does the main rank fsync it, rename it to ``NNNNNN`` and then move ``last``.
A crash at any moment therefore leaves the previous ``last`` complete and resumable, and a
half-written save is never mistaken for a checkpoint (tools skip ``.partial`` dirs).

This module orchestrates the save (synchronous, or staged and written in the background);
what is written is :mod:`ckpt_tools.train.checkpoint.save_job`'s, part by part, and the
load half is :mod:`ckpt_tools.train.checkpoint.load`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ckpt_tools import __version__
from ckpt_tools.errors import CheckpointError, CkptError, NonFiniteError
from ckpt_tools.format import layout
from ckpt_tools.format.record import Topology, TrainingStep
from ckpt_tools.format.rules import save_files
from ckpt_tools.format.rules.startup import saved_format
from ckpt_tools.train.checkpoint import finite, rng, state_dicts
from ckpt_tools.train.checkpoint.load import InitReport, LoadSource, ResumeReport, initialize_from, load_checkpoint
from ckpt_tools.train.checkpoint.save_job import PhaseClock, SaveGroups, SaveJob, StagingBuffers, prepare_partial
from ckpt_tools.train.checkpoint.training_state import TrainingState
from ckpt_tools.train.config import train_config_dict
from ckpt_tools.train.parallel.distributed import DistEnv, barrier, bound_by_collective_timeout, is_transport_failure
from ckpt_tools.train.report.procstats import PeakMemory, now


@dataclass
class SaveStats:
    step: int
    path: Path
    pause_s: float  # how long the training loop stood still
    extra_bytes: list[int | None]  # per rank: peak memory above the pre-save level during the pause
    asynchronous: bool
    phases: dict[str, float]  # seconds per phase of the pause on this rank (sync: and of the writes)


class BackgroundSave:
    """A save job running in a thread beside the loop: stage, then write and commit.

    Staging (copying the state into private host buffers) runs in the thread too, while the
    loop goes on with the next step's forward and backward, which only read the parameters
    and optimizer state. The loop calls :meth:`wait_staged` before it changes them (the
    optimizer update). ``join`` re-raises the thread's failure.
    """

    def __init__(
        self, job: SaveJob, groups: SaveGroups, on_committed: Any, stage: Callable[[SaveJob], SaveJob]
    ) -> None:
        self.job, self.groups, self.on_committed, self.stage = job, groups, on_committed, stage
        self.error: BaseException | None = None
        self.staged = threading.Event()
        self.gate_passed = False  # the loop has waited for the staging once (it reports that wait)
        self.thread = threading.Thread(target=self._run, name=f"ckpt-save-{job.step}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        started = now()
        try:
            try:
                self.job = self.stage(self.job)
                self.job.timings["stage"] = round(now() - started, 4)
            finally:
                self.staged.set()  # also on failure: the loop must not wait forever; join reports it
            self.job.run(self.groups)
        except BaseException as e:  # handed to the loop's thread by join()
            self.error = e
            return
        self.on_committed(self.job, now() - started)

    def wait_staged(self) -> None:
        self.staged.wait()

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            if isinstance(self.error, CkptError) or is_transport_failure(self.error):
                raise self.error
            raise CheckpointError(
                f"background save of step {self.job.step} failed ({type(self.error).__name__}: {self.error});"
                f" {layout.LAST_LINK} still points at the previous complete checkpoint"
            ) from None


@dataclass
class StagingWait:
    """How long the loop waited, before an optimizer update, for a background save's host copy."""

    step: int  # the checkpoint's step
    wait_s: float  # the loop stood still this long (0 when the copy finished under the step's compute)
    stage_s: float  # how long the copy took in the background


class CheckpointManager:
    def __init__(self, state: TrainingState) -> None:
        self.state = state
        assert state.cfg.output_dir is not None
        self.root = Path(state.cfg.output_dir) / layout.CHECKPOINTS_DIR
        self._in_flight: BackgroundSave | None = None
        self._groups: SaveGroups | None = None
        self._cpu_mesh: Any = None
        self._buffers = StagingBuffers()
        self.on_commit: Any = None  # called (path, seconds) when a background save is committed

    # ------------------------------------------------------------------ save

    def save(self, step: int) -> SaveStats:
        """Collective. Synchronous: returns once the checkpoint is committed. Asynchronous
        (``--checkpoint_async``): returns once the state is captured; a background thread
        copies it to host memory (the loop calls :meth:`before_update` before it changes the
        state), then writes and commits it while the loop goes on (at most one save in flight).
        """
        s = self.state
        memory = PeakMemory()
        memory.start()
        pause_phases: dict[str, float] = {}
        clock = PhaseClock(pause_phases)
        started = now()
        self.wait()  # the previous background save must be committed before the next starts
        clock.lap("wait_previous")
        job = self._capture(step)
        clock.lap("capture")
        if s.cfg.checkpoint_async:
            groups = self._background_groups()
            host_mesh, buffers = self._host_mesh(), self._buffers  # collective (once): on this thread

            def stage(captured: SaveJob) -> SaveJob:
                return captured.staged(host_mesh, buffers)

            self._in_flight = BackgroundSave(job, groups, self._on_committed, stage)
            self._in_flight.start()
        else:
            job.run(SaveGroups.training(s.parallel, s.env))
            clock.lap("write")
        pause = now() - started
        extra = _gather_ints(s.env, memory.extra_bytes())
        phases = pause_phases if s.cfg.checkpoint_async else {**pause_phases, **job.timings}
        return SaveStats(step, job.final, pause, extra, s.cfg.checkpoint_async, phases)

    def before_update(self) -> StagingWait | None:
        """Block until the in-flight background save holds its private copy of the state.

        Called before every optimizer update, the first change to the parameters and the
        optimizer state since the save captured them. Returns the wait the first time after
        a save (None otherwise), so that the loop can report the whole pause of the save.
        """
        in_flight = self._in_flight
        if in_flight is None or in_flight.gate_passed:
            return None
        started = now()
        in_flight.wait_staged()
        in_flight.gate_passed = True
        return StagingWait(in_flight.job.step, now() - started, in_flight.job.timings.get("stage", 0.0))

    def staging_bytes(self) -> int:
        """Host memory this rank keeps for background saves: one copy of its model and optimizer shards."""
        return self._buffers.nbytes

    def wait(self) -> None:
        """Block until the in-flight background save (if any) is committed; re-raise its failure."""
        if self._in_flight is None:
            return
        in_flight, self._in_flight = self._in_flight, None
        in_flight.join()

    def _capture(self, step: int) -> SaveJob:
        """Collective: everything the checkpoint of ``step`` will hold, and an empty partial dir.

        State holding NaN or ±inf is refused here, before anything is written, on every rank.
        """
        s = self.state
        only = self._peft_trainable()
        model = state_dicts.sharded_model_state(s.parallel, only)  # views of the live shards, no copies
        optimizer = state_dicts.sharded_optimizer_state(s.parallel, s.optimizer)
        self._refuse_nonfinite(step, model, optimizer)
        peft = s.peft_model is not None
        assert s.cfg.policy is not None
        ema_model = s.ema.model_state(model) if s.ema is not None else None
        ema_state = s.ema.lerobot_state() if s.ema is not None and not s.parallel.sharded and s.env.is_main else None
        job = SaveJob(
            step=step,
            root=self.root,
            final_name=layout.step_dir_name(step, s.cfg.steps),
            env=s.env,
            model=model,
            optimizer=optimizer,
            rng_states=rng.gather_rng_states(s.env),
            record=self.record(step),
            policy_config=s.cfg.policy,
            train_config=train_config_dict(s.cfg),
            scheduler_state=s.scheduler.state_dict(),
            scaler_state=s.scaler.state_dict() if s.scaler is not None else None,
            processors=(s.preprocessor, s.postprocessor),
            adapter_config=s.peft_model.peft_config["default"] if peft else None,
            ema_model=ema_model,
            ema_state=ema_state,
            save_id=_shared_save_id(s.env),
            keep_last_n=s.cfg.checkpoint.keep_last_n,
            last_pointer_file=s.cfg.checkpoint.last_link == "file",
        )
        if s.env.is_main:
            prepare_partial(job)
        barrier(s.env)
        return job

    def _refuse_nonfinite(self, step: int, model: dict[str, Any], optimizer: dict[str, Any]) -> None:
        """Collective: :class:`NonFiniteError` on every rank when any rank's shards hold NaN or ±inf."""
        parts = {"model": model, "optimizer": optimizer}
        if self.state.ema is not None:
            parts["ema"] = self.state.ema.shadow  # the EMA weights are published too: never NaN either
        bad, total = finite.nonfinite_names(self.state.env, parts)
        if bad:
            last = layout.resolve_last(self.root)  # any earlier background save was committed by now
            raise NonFiniteError(finite.refusal(step, bad, total, str(last) if last else "none"))

    def _background_groups(self) -> SaveGroups:
        if self._groups is None:
            self._groups = SaveGroups.background(self.state.parallel, self.state.env)
        return self._groups

    def _host_mesh(self) -> Any:
        """The mesh host copies of sharded tensors live on: the training mesh when it is a CPU one."""
        mesh = self.state.parallel.mesh
        if mesh is None or mesh.device_type == "cpu":
            return mesh
        from torch.distributed.device_mesh import init_device_mesh

        if self._cpu_mesh is None:  # collective, once
            self._cpu_mesh = init_device_mesh("cpu", tuple(mesh.mesh.shape), mesh_dim_names=mesh.mesh_dim_names)
            bound_by_collective_timeout(self._cpu_mesh.get_all_groups())
        return self._cpu_mesh

    def _on_committed(self, job: SaveJob, seconds: float) -> None:
        if self.on_commit is not None:
            self.on_commit(job.final, seconds, job.timings)

    def _peft_trainable(self) -> set[str] | None:
        return state_dicts.trainable_names(self.state.parallel) if self.state.peft_model is not None else None

    def record(self, step: int) -> TrainingStep:
        s = self.state
        topology = Topology(
            world_size=s.env.world_size,
            dp_replicate=s.parallel.dp_replicate,
            dp_shard=s.parallel.dp_shard,
            nnodes=s.env.nnodes,
        )
        return TrainingStep(
            step=step,
            samples_seen=s.sampler.samples_seen,
            optimizer_steps=s.optimizer_steps,
            adam_step=state_dicts.adam_step(s.optimizer),  # ties the optimizer state to this record
            dp_world_size=topology.dp_world_size,
            batch_size=s.cfg.batch_size,
            grad_accum_steps=s.cfg.grad_accum_steps,
            mixed_precision=s.cfg.accelerator.mixed_precision,
            mixed_precision_policy=s.precision.record(),
            checkpoint_format=saved_format(s.cfg.format, s.parallel.sharded).value,
            topology=topology,
            sampler=s.sampler.position(),
            sharded=s.parallel.sharded,
            peft=s.peft_model is not None,
            ema_steps=s.ema.optimization_step if s.ema is not None else None,
            versions={"torch": torch.__version__, "ckpt_tools": __version__},
            initialized_from=s.initialized_from,
        )

    # ------------------------------------------------------------------ load

    def load(self, step_dir: Path) -> ResumeReport:
        """Collective: restore everything from ``step_dir`` onto the current topology."""
        return load_checkpoint(self.state, step_dir, self._peft_trainable())

    def initialize(self, source: LoadSource) -> InitReport:
        """Collective: a new run's chosen parts from another run's checkpoint (``--checkpoint.load_from``)."""
        return initialize_from(self.state, source)


def _shared_save_id(env: DistEnv) -> str:
    """Collective: a new save id, the main rank's, on every rank (each file is stamped with it)."""
    ids = [save_files.new_save_id()]
    if env.distributed:
        dist.broadcast_object_list(ids, src=0)
    return ids[0]


def _gather_ints(env: DistEnv, value: int | None) -> list[int | None]:
    """Collective: one small value from every rank (on every rank)."""
    if not env.distributed:
        return [value]
    out: list[int | None] = [None] * env.world_size
    dist.all_gather_object(out, value)
    return out
