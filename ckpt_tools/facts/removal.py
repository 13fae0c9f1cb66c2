"""Whether a DCP container may be deleted from a step: what remains must still resume as before.

``convert-dcp --delete-dcp`` replaces a DCP container by a file it wrote. The shards may go
only when, by the manifest, what remains is a complete checkpoint the trainer resumes from
exactly as it would have from the shards:

- the loader's choice among the part's alternatives (:func:`~manifest.weights_inputs`,
  :func:`~manifest.optimizer_inputs`) is still there, with every file it reads - a file the
  trainer does not read (``optimizer_state_flat.safetensors``, weights under ``--output``
  elsewhere or split by ``--max-shard-size``) is no replacement;
- every other part the saving run's :class:`~manifest.Variant` requires is there;
- every state file a resume onto the same topology and precision reads
  (:class:`~manifest.Resume`) is there;
- the layout is still resumable (:func:`~ckpt_tools.facts.resumable.unresumable_reason`) by the
  trainer whose checkpoint it is - LeRobot's for a checkpoint LeRobot wrote, whose resume of a
  ``dcp`` / ``safetensors_dcp`` run reads the weights from the shards only
  (:mod:`ckpt_tools.format.rules.lerobot_resume`).

That the replacement holds the same numbers - no dtype cast - is the other half, by
:func:`~ckpt_tools.format.rules.master_copy_problem`, which ``verify-resume`` applies to a
checkpoint after the fact.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ckpt_tools.errors import CkptError
from ckpt_tools.facts.record import read_record
from ckpt_tools.facts.resumable import unresumable_reason
from ckpt_tools.format import manifest
from ckpt_tools.format.layout import CheckpointFormat, StepPaths
from ckpt_tools.format.manifest import Part
from ckpt_tools.format.rules.resumable import Trainer, checkpoint_trainer
from ckpt_tools.format.train_config import read_saved_config

DCP_PARTS = (manifest.MODEL_DCP, manifest.OPTIMIZER_DCP)


def dcp_part_at(step: StepPaths, directory: Path) -> Part | None:
    """The manifest's DCP part that ``directory`` is in ``step`` (None: a DCP dir the loader never reads)."""
    real = os.path.realpath(directory)
    return next((p for p in DCP_PARTS if os.path.realpath(step.root / p.path) == real), None)


def removal_refusal(step: StepPaths, removed: Part, *, written: Iterable[Path] = ()) -> str | None:
    """Why deleting the DCP part ``removed`` from ``step`` leaves a checkpoint that no longer resumes as before.

    None when it would still be complete and resume exactly as before. ``written``: files that
    will exist by then besides those present now (a conversion's planned outputs).
    """
    if removed not in DCP_PARTS:
        raise ValueError(f"{removed.key}: not a DCP part")
    try:
        record = read_record(step)
    except CkptError as e:
        return f"{e}, so this is no checkpoint a resume can read"
    peft = manifest.is_peft(step.pretrained_model, record=record)
    coming = {os.path.realpath(p) for p in written}

    def there(part: Part, *, stand_ins: bool = False) -> bool:
        if part is removed:
            return False
        if stand_ins and any(_exists(step, f, coming) for f in part.stand_ins):
            return True
        return all(_exists(step, f, coming) for f in part.required_files())

    inputs = manifest.weights_inputs(peft) if removed is manifest.MODEL_DCP else manifest.optimizer_inputs()
    if not any(there(p) for p in inputs):
        kind = "weights" if removed is manifest.MODEL_DCP else "optimizer state"
        others = " or ".join(" + ".join(p.required_files()) for p in inputs if p is not removed)
        return (
            f"{removed.path}/ holds the only {kind} a resume reads (the trainer's other input, {others}, is not"
            " there: the converted file is not what the trainer loads)"
        )
    variant = manifest.Variant.at(step, record, peft)
    saved_world = record.topology.world_size if record.topology is not None else 0
    resume = manifest.Resume.at(step, record, saved_world, record.mixed_precision)
    wanted = [p for p in manifest.required_parts(variant) if p is not removed and p not in inputs]
    wanted += [p for p in manifest.resume_reads(resume) if p not in wanted]
    missing = [p for p in wanted if not there(p, stand_ins=True)]
    if missing:
        names = "; ".join(f"{p.marker} ({p.what})" for p in missing)
        return f"what remains would be an incomplete checkpoint: missing {names}"
    has_optimizer = any(there(p) for p in manifest.optimizer_inputs())
    trainer = checkpoint_trainer(step, record)
    if trainer is Trainer.LEROBOT and removed is manifest.MODEL_DCP:
        try:
            fmt = read_saved_config(step.train_config).checkpoint_format
        except CkptError:
            fmt = record.checkpoint_format
        if fmt in (CheckpointFormat.DCP.value, CheckpointFormat.SAFETENSORS_DCP.value):
            return (
                f"LeRobot resumes this checkpoint_format={fmt} run's weights from {removed.path}/ only: without it"
                f' lerobot-train --resume=true stops ("checkpoint_format={fmt} declares DCP model shards, but ... is'
                ' missing")'
            )
    return unresumable_reason(step, record, has_optimizer=has_optimizer, trainer=trainer)


def _exists(step: StepPaths, rel: str, coming: set[str]) -> bool:
    path = step.root / rel
    return path.exists() or os.path.realpath(path) in coming
