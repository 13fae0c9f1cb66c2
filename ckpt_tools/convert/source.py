"""What to convert: the DCP directory (or torch's HF-storage pieces) a path the user named stands for.

A step dir, its ``pretrained_model/`` or ``training_state/``, a DCP dir itself, a checkpoints
root (its ``last`` step), another trainer's root of ``step-N/`` saves (its newest), the EMA
shadow of a step, or a folder of safetensors pieces. A DCP dir that an interrupted
``--delete-dcp`` already moved aside resolves with ``interrupted`` set, so the rerun finishes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from ckpt_tools.convert import delete
from ckpt_tools.dcp import hf_storage
from ckpt_tools.errors import CheckpointError, UsageError
from ckpt_tools.format import layout as L
from ckpt_tools.format.ema import no_ema_weights
from ckpt_tools.io.fsutil import Leftover

_WHOLE_STEP = (L.PathKind.CHECKPOINTS_ROOT, L.PathKind.STEP_DIR)  # paths that name a step, not a part of it


@dataclass(frozen=True)
class Source:
    dcp_dir: Path
    what: str
    pretrained_model: Path | None  # where adapter_config.json would be
    notes: tuple[str, ...] = ()
    step: L.StepPaths | None = None  # the step the DCP dir is in (None: a loose DCP dir)
    interrupted: tuple[Leftover, ...] = ()  # dcp_dir is gone: an earlier --delete-dcp moved it aside, unfinished
    pieces: hf_storage.HfStorage | None = None  # dcp_dir holds torch's HF-storage pieces, not .distcp shards


def resolve(path: Path, what: str | None, *, ema: bool = False) -> Source:
    """The source ``path`` names: its EMA shards with ``ema``, else :func:`resolve_source`'s."""
    return resolve_ema_source(path) if ema else resolve_source(path, what)


def resolve_source(path: Path, what: str | None) -> Source:
    """The DCP directory to convert: in the step ``path`` means (:func:`~ckpt_tools.format.layout.resolve_step`),
    or a DCP dir / ``pretrained_model/`` / ``training_state/`` given directly, in a step or not.

    A DCP dir that an interrupted ``--delete-dcp`` already moved aside resolves with ``interrupted`` set.
    """
    if not path.exists() and not path.is_symlink():
        pending = delete.interrupted_deletes(path)
        if pending:
            guess = "optimizer" if path.name == L.OPTIMIZER_DCP_DIR else "model"
            return Source(path, what or guess, None, interrupted=tuple(pending))
    located = L.locate(path)
    kind = located.kind
    if kind is L.PathKind.TRAINER_ROOT:
        newest = L.newest_trainer_step(located.path)
        note = f"converting {newest.name}, the newest save in {located.path}"
        return replace(resolve_source(newest, what), notes=(note,))
    if kind in (L.PathKind.SAFETENSORS_FILE, L.PathKind.SAFETENSORS_DIR):
        return pieces_source(located, what)
    step = L.resolve_step(path) if kind in _WHOLE_STEP or located.step is not None else None
    notes: tuple[str, ...] = ()
    if kind is L.PathKind.CHECKPOINTS_ROOT:
        assert step is not None
        notes = (f"converting {step.root.name}, the step 'last' points at",)
    if kind is L.PathKind.DCP_DIR:
        dcp_dir = located.path
        if what is None:
            what = "optimizer" if dcp_dir.name.startswith(L.OPTIMIZER_DCP_DIR.rsplit("_", 1)[0]) else "model"
        pm = dcp_dir.parent if (dcp_dir.parent / L.ADAPTER_CONFIG).exists() or step is None else step.pretrained_model
        return Source(dcp_dir, what, pm, notes, step)
    what = what or "model"
    if kind in _WHOLE_STEP:
        assert step is not None
        pm, ts = step.pretrained_model, step.training_state
    elif kind is L.PathKind.PRETRAINED_MODEL:
        pm, ts = located.path, (step.training_state if step else located.path.parent / L.TRAINING_STATE_DIR)
    else:  # training_state/
        ts, pm = located.path, (step.pretrained_model if step else located.path.parent / L.PRETRAINED_MODEL_DIR)
    dcp_dir = pm / L.MODEL_DCP_DIR if what == "model" else ts / L.OPTIMIZER_DCP_DIR
    if not dcp_dir.is_dir() and not dcp_dir.is_symlink():
        pending = delete.interrupted_deletes(dcp_dir)
        if pending:
            return Source(dcp_dir, what, pm, notes, step, tuple(pending))
    if not dcp_dir.is_dir():
        if what == "model" and ((pm / L.MODEL_WEIGHTS).exists() or (pm / L.ADAPTER_WEIGHTS).exists()):
            raise CheckpointError(
                f"{pm}: no {L.MODEL_DCP_DIR}/ to convert - the weights are already in safetensors form"
            )
        raise CheckpointError(f"{dcp_dir}: missing - this checkpoint has no DCP shards for the {what}")
    return Source(dcp_dir, what, pm, notes, step)


def resolve_ema_source(path: Path) -> Source:
    """The EMA shadow's DCP directory of the step ``path`` is in (``pretrained_model_ema/pytorch_model_fsdp_0/``)."""
    located = L.locate(path)
    if located.kind is L.PathKind.DCP_DIR:
        if located.path.parent.name != L.PRETRAINED_MODEL_EMA_DIR:
            raise CheckpointError(f"{path}: not the EMA shards (those are in {L.PRETRAINED_MODEL_EMA_DIR}/)")
        return Source(located.path, "model", located.path.parent, (), located.step)
    if located.kind is L.PathKind.PRETRAINED_MODEL and located.path.name == L.PRETRAINED_MODEL_EMA_DIR:
        step = located.step
    else:
        step = L.resolve_step(path)
    if step is None:
        raise CheckpointError(
            f"{path}: not inside a checkpoint step directory (no {L.PRETRAINED_MODEL_EMA_DIR}/ to find)"
        )
    ema_dir = step.pretrained_model_ema
    if not step.ema_model_dcp.is_dir():
        if step.ema_model_weights.exists():
            raise CheckpointError(
                f"{ema_dir}: no {L.MODEL_DCP_DIR}/ to convert - the EMA weights are already in safetensors form"
            )
        raise CheckpointError(no_ema_weights(step))
    notes = (f"converting the EMA weights of {step.root.name}",)
    return Source(step.ema_model_dcp, "model", ema_dir, notes, step)


def pieces_source(located: L.Located, what: str | None) -> Source:
    """A folder of safetensors (or one file of it): torch's HF-storage pieces to merge, or nothing to convert."""
    folder = located.path if located.kind is L.PathKind.SAFETENSORS_DIR else located.path.parent
    store = hf_storage.load(folder)
    hf_storage.require_sound(store)
    if not store.needs_merge:
        layout = " (torch's HF-storage layout, every tensor whole)" if store.sharding_info else ""
        raise CheckpointError(
            f"{located.path}: nothing to convert - already safetensors holding {len(store.pieces)} whole tensors{layout}"
        )
    notes = () if folder == located.path else (f"merging every piece in {folder}/, not only {located.path.name}",)
    return Source(folder, what or "model", None, notes, pieces=store)


def check_pieces_request(source: Source, output: str | os.PathLike[str] | None, delete_dcp: bool) -> None:
    if delete_dcp:
        raise UsageError(
            f"{source.dcp_dir}: --delete-dcp removes DCP shard directories only, not torch's HF-storage pieces"
        )
    if output is None:
        raise UsageError(
            f"{source.dcp_dir}: holds torch's HF-storage pieces; give --output DIR (or FILE.safetensors) for the merged"
            " tensors, which would otherwise mix with the pieces"
        )
