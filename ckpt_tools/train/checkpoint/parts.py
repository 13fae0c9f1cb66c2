"""Each part of a checkpoint, its save next to its load.

The torch-free manifest (:mod:`ckpt_tools.format.manifest`) says which parts a checkpoint
holds and which container a resume reads; this module is how the training core writes each
one and reads it back, one ``save_*``/``load_*`` pair per part, so that a reader sees what a
load expects from what its save wrote. :class:`~ckpt_tools.train.checkpoint.save_job.SaveJob`
writes the parts the manifest lists for the run; :mod:`ckpt_tools.train.checkpoint.load`
restores them. Adding a part is one manifest entry plus its pair here.

The configs and the processors have no load here: a resume does not read them back from the
checkpoint. It starts from ``train_config.json`` (parsed before anything else) and rebuilds
the policy and its processors from that config and the dataset; ``--policy.path`` reads a
saved policy through :func:`~ckpt_tools.train.policies.base.load_policy_config` and
:meth:`~ckpt_tools.train.data.processors.Pipeline.load`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from ckpt_tools.errors import CheckpointError, LegacyCheckpoint
from ckpt_tools.facts.record import read_record
from ckpt_tools.facts.resumable import unresumable_reason
from ckpt_tools.format import layout, manifest
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.peft_keys import saved_adapter_key
from ckpt_tools.format.record import TrainingStep, training_step_json
from ckpt_tools.format.rules import master_copy_problem, save_stamps
from ckpt_tools.io.fsutil import write_json_atomic
from ckpt_tools.io.safe_read import read_json_file
from ckpt_tools.train import ema
from ckpt_tools.train.checkpoint import rng, state_dicts
from ckpt_tools.train.checkpoint.dcp_io import dcp_load, dcp_save
from ckpt_tools.train.checkpoint.gathered_write import RowWriter, write_gathered
from ckpt_tools.train.checkpoint.written_digests import WrittenDigests
from ckpt_tools.train.data.processors import Pipeline
from ckpt_tools.train.parallel.distributed import DistEnv
from ckpt_tools.train.parallel.precision import dtype_name
from ckpt_tools.train.parallel.wrap import ParallelModel
from ckpt_tools.train.policies.base import save_policy_config as write_policy_config
from ckpt_tools.train.policies.configs import PolicyConfig


class ModelDirs(Protocol):
    """Where a policy's files go: a step's ``pretrained_model/`` (:class:`StepPaths`) or its EMA twin."""

    @property
    def pretrained_model(self) -> Path: ...

    @property
    def model_dcp(self) -> Path: ...


# ====================================================================== weights: DCP shards


def save_model_dcp(
    model: dict[str, Any],
    paths: ModelDirs,
    group: Any,
    written: WrittenDigests | None = None,
    save_id: str | None = None,
) -> None:
    """Collective: each rank writes its own shards of ``pytorch_model_fsdp_0/`` (digests into ``written``)."""
    dcp_save({layout.MODEL_DCP_KEY: model}, paths.model_dcp, group, written, save_id)


def load_model_dcp(parallel: ParallelModel, paths: StepPaths, trainable: set[str] | None) -> dict[str, int]:
    """Collective: reshard the saved weights onto the running layout (PEFT: only the trainable ones).

    Returns the bytes read per file (the resume audit).
    """
    state = state_dicts.sharded_model_state(parallel, trainable)
    reads = dcp_load({layout.MODEL_DCP_KEY: state}, paths.model_dcp, paths.root)
    state_dicts.load_sharded_model_state(parallel, state, partial=trainable is not None)
    return reads


# ====================================================================== weights: one gathered file


def save_gathered_weights(
    model: dict[str, Any],
    path: Path,
    peft: bool,
    rows: RowWriter,
    barrier: Callable[[], None],
    written: WrittenDigests | None = None,
    save_id: str | None = None,
) -> None:
    """Collective: ``model.safetensors`` (PEFT: ``adapter_model.safetensors``, under peft's saved names)."""
    gathered = {saved_adapter_key(k) if peft else k: v for k, v in model.items()}
    write_gathered(gathered, path, rows, barrier, {"format": "pt", **_stamp(save_id)}, written)


def load_gathered_weights(parallel: ParallelModel, path: Path, trainable: set[str] | None) -> str | None:
    """The gathered file into the running layout (PEFT: saved names mapped back onto the live ones).

    Returns why the resume is not bit-exact (:func:`~ckpt_tools.format.rules.master_copy_problem`:
    the file holds the weights in another dtype than the live parameters, and loading casts
    them), or None - the warning ``verify-resume`` gives for the same file.
    """
    full = _load_safetensors(path)
    if trainable is not None:
        full = peft_keys_to_model_keys(full, trainable)
    live = {name: dtype_name(p.dtype) for name, p in parallel.inner.named_parameters()}
    saved = {k: name for k, v in full.items() if (name := dtype_name(v.dtype)) is not None}
    problem = master_copy_problem(saved, {k: name for k, name in live.items() if name is not None})
    state_dicts.load_full_model_state(parallel, full, partial=trainable is not None)
    return f"{path.name}: {problem}" if problem is not None else None


def peft_keys_to_model_keys(adapter: dict[str, torch.Tensor], model_keys: set[str]) -> dict[str, torch.Tensor]:
    """Map saved adapter names (no adapter name, peft's convention) onto live parameter names."""
    by_saved = {saved_adapter_key(k): k for k in model_keys}
    out = {}
    for key, value in adapter.items():
        if key not in by_saved:
            raise CheckpointError(f"adapter weights hold '{key}', which the current PEFT model does not have")
        out[by_saved[key]] = value
    return out


# ====================================================================== optimizer: DCP shards


def save_optimizer_dcp(
    optimizer_state: dict[str, Any],
    paths: StepPaths,
    group: Any,
    written: WrittenDigests | None = None,
    save_id: str | None = None,
) -> None:
    """Collective: each rank writes its own shards of ``optimizer_0/`` (digests into ``written``)."""
    dcp_save({layout.OPTIMIZER_DCP_KEY: optimizer_state}, paths.optimizer_dcp, group, written, save_id)


def load_optimizer_dcp(parallel: ParallelModel, optimizer: torch.optim.Optimizer, paths: StepPaths) -> dict[str, int]:
    """Collective: reshard the saved optimizer state onto the running layout; returns the bytes read per file."""
    state = state_dicts.optimizer_state_to_load(parallel, optimizer)
    reads = dcp_load({layout.OPTIMIZER_DCP_KEY: state}, paths.optimizer_dcp, paths.root)
    state_dicts.load_sharded_optimizer_state(parallel, optimizer, state)
    return reads


# ====================================================================== optimizer: flat files


def save_flat_optimizer(optimizer_state: dict[str, Any], paths: StepPaths, save_id: str | None = None) -> None:
    """Main rank (a non-sharded run): ``optimizer_state.safetensors`` + ``optimizer_param_groups.json``."""
    state_dicts.write_flat_optimizer(
        optimizer_state, paths.optimizer_state, paths.optimizer_param_groups, _stamp(save_id)
    )


def load_flat_optimizer(parallel: ParallelModel, optimizer: torch.optim.Optimizer, paths: StepPaths) -> None:
    """The flat files, keyed by parameter name: they load into a sharded run too."""
    state_dicts.load_flat_optimizer(parallel, optimizer, paths.optimizer_state, paths.optimizer_param_groups)


# ====================================================================== RNG state


def save_rng_state(
    states: dict[str, torch.Tensor], paths: StepPaths, world_size: int, save_id: str | None = None
) -> None:
    """Main rank: every rank's generator state (gathered at capture) in ``rng_state.safetensors``."""
    rng.save_rng_states(states, paths.rng_state, world_size, _stamp(save_id))


def load_rng_state(paths: StepPaths, env: DistEnv) -> None:
    """This rank's own generator, saved on the same world size (another one reseeds: :func:`rng.reseed`)."""
    rng.load_rng_states(paths.rng_state, env)


# ====================================================================== LR scheduler


def save_scheduler_state(state: dict[str, Any], paths: StepPaths, save_id: str | None = None) -> None:
    write_json_atomic(paths.scheduler_state, {**state, **_stamp(save_id)})


def load_scheduler_state(scheduler: torch.optim.lr_scheduler.LRScheduler, paths: StepPaths) -> None:
    """The saved state without the save's stamp (``load_state_dict`` would make it an attribute)."""
    scheduler.load_state_dict(_unstamped(read_json_file(paths.scheduler_state, want_object=True)))


# ====================================================================== fp16 loss scaler


def save_scaler_state(state: dict[str, Any], paths: StepPaths, save_id: str | None = None) -> None:
    write_json_atomic(paths.scaler_state, {**state, **_stamp(save_id)})


def load_scaler_state(scaler: Any, paths: StepPaths) -> None:
    if not paths.scaler_state.exists():
        raise CheckpointError(
            f"{paths.scaler_state}: missing; --accelerator.mixed_precision=fp16 needs the saved loss-scaler state"
        )
    scaler.load_state_dict(_unstamped(read_json_file(paths.scaler_state, want_object=True)))


# ====================================================================== the EMA shadow (--ema.enable=true)


@dataclass(frozen=True)
class EmaAsModel:
    """``pretrained_model_ema/`` seen as the model's directory: the EMA weights are written as the model's are."""

    step: StepPaths

    @property
    def pretrained_model(self) -> Path:
        return self.step.pretrained_model_ema

    @property
    def model_dcp(self) -> Path:
        return self.step.ema_model_dcp


def save_ema_state(state: dict[str, Any], paths: StepPaths) -> None:
    """Main rank, a run that is not sharded: LeRobot's ``training_state/ema_state.pt``."""
    ema.save_lerobot_state(state, paths.ema_state)


def load_ema(shadow: ema.EmaShadow, parallel: ParallelModel, paths: StepPaths, record: TrainingStep) -> dict[str, int]:
    """Collective: the shadow from the container the manifest chooses, resharded onto the running layout.

    The DCP shards load into the sharded shadow as the model's do; the gathered file and
    LeRobot's ``ema_state.pt`` are full tensors each rank takes its shards of. The update count
    is the record's (``ema_steps``), or the ``.pt``'s for a checkpoint LeRobot wrote.
    Returns the DCP bytes read per file.
    """
    chosen = manifest.choose(manifest.ema_inputs(), paths)
    if chosen is None:
        raise CheckpointError(
            f"{paths.pretrained_model_ema}: no EMA weights ({manifest.EMA_DCP.name}, {manifest.EMA_WEIGHTS.name}"
            f" or {manifest.EMA_STATE.path})"
        )
    reads: dict[str, int] = {}
    steps = record.ema_steps
    if chosen is manifest.EMA_DCP:
        state = shadow.model_state(state_dicts.sharded_model_state(parallel, None))
        params = {k: v for k, v in state.items() if k in shadow.shadow}
        reads = dcp_load({layout.MODEL_DCP_KEY: params}, paths.ema_model_dcp, paths.root)
    elif chosen is manifest.EMA_WEIGHTS:
        shadow.load_full(_load_safetensors(paths.ema_model_weights))
    else:
        full, saved_steps = ema.read_lerobot_state(paths.ema_state, shadow)
        shadow.load_full(full)
        steps = saved_steps if steps is None else steps
    if steps is None:
        raise CheckpointError(f"{paths.training_step}: no ema_steps - the EMA update count cannot be restored")
    shadow.optimization_step = steps
    return reads


# ====================================================================== the record


def save_training_step(record: TrainingStep, paths: StepPaths, save_id: str | None = None) -> None:
    """Written last: a ``training_step.json`` means everything it describes is there."""
    paths.training_step.write_text(training_step_json(record, save_id))


def load_training_step(paths: StepPaths) -> TrainingStep:
    """The record, refused when its checkpoint can never be resumed (LeRobot's, the 0.6.x layout, no optimizer state).

    Read as the tools read it (:func:`~ckpt_tools.facts.record.read_record`: a LeRobot record
    completed from its files), so the refusal is the line ``verify-resume --trainer ckpt-train`` gives.
    """
    record = read_record(paths)
    check_resumable(paths, record)
    return record


def check_resumable(paths: StepPaths, record: TrainingStep) -> None:
    """Refuse LeRobot's checkpoints, the 0.6.x layout, optimizer-less sharded checkpoints and records
    without a data position."""
    has_optimizer = manifest.choose(manifest.optimizer_inputs(), paths) is not None
    reason = unresumable_reason(paths, record, has_optimizer=has_optimizer)
    if reason is not None:
        raise LegacyCheckpoint(reason) if record.is_legacy else CheckpointError(reason)


# ====================================================================== configs and processors (save only)


def save_policy_config(config: PolicyConfig, paths: ModelDirs) -> None:
    write_policy_config(config, paths.pretrained_model)


def save_train_config(config: dict[str, Any], paths: StepPaths) -> None:
    write_json_atomic(paths.train_config, config)


def save_adapter_config(adapter_config: Any, paths: StepPaths) -> None:
    """peft's own ``save_pretrained``: ``adapter_config.json`` as ``PeftModel.from_pretrained`` reads it."""
    adapter_config.save_pretrained(str(paths.pretrained_model))


def save_processors(processors: tuple[Pipeline, Pipeline], paths: ModelDirs) -> None:
    for pipeline in processors:
        pipeline.save(paths.pretrained_model)


# ====================================================================== the save's stamp


def _stamp(save_id: str | None) -> dict[str, str]:
    """The entry that stamps a file with its save's id (:mod:`~ckpt_tools.format.rules.save_stamps`)."""
    return {save_stamps.KEY: save_id} if save_id is not None else {}


def _unstamped(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != save_stamps.KEY}


# ====================================================================== reading helpers


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise CheckpointError(f"{path}: unreadable ({e})") from None
