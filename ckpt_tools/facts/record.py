"""``training_step.json`` completed by what the files say: the record every resume and tool reads.

A LeRobot record leaves out what only the files tell (:func:`ckpt_tools.format.manifest.complete_record`);
this module reads those files - the flat optimizer state's keys, from its safetensors header -
and completes the record with them.
"""

from __future__ import annotations

from ckpt_tools.errors import CkptError
from ckpt_tools.format import lerobot, manifest
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.record import TrainingStep, read_training_step
from ckpt_tools.st.header import read_header


def read_record(paths: StepPaths) -> TrainingStep:
    """``training_step.json`` of ``paths``, with what the files tell where the record does not.

    Raises :class:`~ckpt_tools.errors.CheckpointError` (one line) when the record is unusable.
    """
    record = read_training_step(paths.training_step)
    by_name = flat_optimizer_by_name(paths) if manifest.derives_topology(record) else None
    return manifest.complete_record(paths, record, flat_optimizer_by_name=by_name)


def flat_optimizer_by_name(paths: StepPaths) -> bool | None:
    """Whether the flat optimizer state is keyed by parameter name (LeRobot 0.6.x FSDP), by position
    (False), or cannot tell (None: not there, or unreadable)."""
    try:
        header = read_header(paths.optimizer_state)
    except CkptError:
        return None
    return lerobot.keyed_by_name(list(header.entries))
