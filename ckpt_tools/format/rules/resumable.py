"""Whether a checkpoint can be resumed at all, decided once for the trainer and the tools.

Two layouts are refused outright, each with its own plain message:

- the 0.6.x layout: ``training_step.json`` with ``num_processes`` and no topology (those
  sharded runs gathered the optimizer state into one file and recorded nothing else);
- a sharded checkpoint without any optimizer state (``optimizer_0/`` deleted or never
  written): the weights are there, the optimizer is not.

Both still load as a pretrained policy, which the message says.
"""

from __future__ import annotations

from ckpt_tools.format import layout
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.record import TrainingStep


def unresumable_reason(paths: StepPaths, record: TrainingStep) -> str | None:
    """One line saying why ``paths`` can never be resumed, or None when its layout can."""
    as_pretrained = f"its weights still load as a pretrained policy: --policy.path={paths.pretrained_model}"
    if record.is_legacy:
        return (
            f"{paths.root}: a 0.6.x-era checkpoint (gathered optimizer state, no {layout.OPTIMIZER_DCP_DIR}/,"
            f" training_step.json without topology) cannot be resumed; {as_pretrained}"
        )
    if record.sharded and not paths.optimizer_dcp.exists() and not paths.optimizer_state.exists():
        return (
            f"{paths.optimizer_dcp}: missing - this sharded checkpoint holds no optimizer state and cannot be"
            f" resumed; {as_pretrained}"
        )
    if record.samples_seen is None:
        return f"{paths.training_step}: no samples_seen; the data position cannot be restored"
    return None
