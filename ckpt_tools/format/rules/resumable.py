"""Whether a checkpoint can be resumed at all, decided once for the trainer and the tools.

Two layouts are refused outright, each with its own plain message:

- the 0.6.x layout: ``training_step.json`` with ``num_processes`` and no topology (those
  sharded runs gathered the optimizer state into one file and recorded nothing else);
- a sharded checkpoint without any optimizer state (``optimizer_0/`` deleted or never
  written): the weights are there, the optimizer is not.

Both still load as a pretrained policy, which the message says.

And one rule for whether a resume is *bit-exact*: :func:`master_copy_problem` - the weights a
resume reads must be the copy training holds, not one cast to another dtype (``convert-dcp
--dtype bf16`` of fp32 master weights): loading casts them back silently, and the resumed run
continues from rounded weights.
"""

from __future__ import annotations

from collections.abc import Mapping

from ckpt_tools.format import layout
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.record import TrainingStep


def unresumable_reason(paths: StepPaths, record: TrainingStep, *, has_optimizer: bool) -> str | None:
    """One line saying why ``paths`` can never be resumed, or None when its layout can.

    ``has_optimizer``: whether the loader finds optimizer state to read, the manifest's choice
    (``manifest.choose(manifest.optimizer_inputs(), paths)``; the manifest needs these rules, so
    the caller asks it): a DCP directory counts only once its ``.metadata`` is written.
    """
    as_pretrained = f"its weights still load as a pretrained policy: --policy.path={paths.pretrained_model}"
    if record.is_legacy:
        return (
            f"{paths.root}: a 0.6.x-era checkpoint (gathered optimizer state, no {layout.OPTIMIZER_DCP_DIR}/,"
            f" training_step.json without topology) cannot be resumed; {as_pretrained}"
        )
    if record.sharded and not has_optimizer:
        what = f"no {layout.DCP_METADATA} (its save did not complete)" if paths.optimizer_dcp.is_dir() else "missing"
        return (
            f"{paths.optimizer_dcp}: {what} - this sharded checkpoint holds no optimizer state and cannot be"
            f" resumed; {as_pretrained}"
        )
    if record.samples_seen is None:
        return f"{paths.training_step}: no samples_seen; the data position cannot be restored"
    return None


def master_copy_problem(weights: Mapping[str, str], master: Mapping[str, str]) -> str | None:
    """Why ``weights`` are not the copy training holds - so a resume from them is not bit-exact - or None.

    ``weights``: tensor name -> dtype (torch's name) as the container a resume reads holds it.
    ``master``: tensor name -> the dtype training holds it in: for the trainer its live
    parameters; for the tools the dtype of each parameter's Adam moments (kept in the
    parameter's dtype), or of the DCP shards a conversion read. Names only one side has are
    not compared.
    """
    cast = sorted(n for n, dtype in weights.items() if n in master and master[n] != dtype)
    if not cast:
        return None
    name = cast[0]
    return (
        f"{len(cast)} of {len(weights)} tensors are {weights[name]} where training holds them in {master[name]}"
        f" (e.g. {name}): a resume casts them back and does not continue bit-exactly"
    )
