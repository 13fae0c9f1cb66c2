"""LeRobot's resume rules that depend on the resumed run, for predicting ``lerobot-train --resume=true``.

``verify-resume`` and ``reshard-plan`` predict LeRobot's own resume for a checkpoint LeRobot
wrote (:func:`~ckpt_tools.format.rules.resumable.checkpoint_trainer`). Besides the mesh rules it
shares with ``ckpt-train`` (:func:`~ckpt_tools.format.rules.startup.world_refusals`: ``R×S`` =
processes, DDP filling an untouched ``1×1``, DCP formats only on sharded runs), LeRobot main
refuses, as its source says:

- ``src/lerobot/common/train_utils.py`` ``_guard_resume_changes``: a resume that crosses the
  sharded/non-sharded boundary of the parallelism snapshot the record holds ("resharding works
  across sizes, not across kinds"); a record without a snapshot (LeRobot 0.6.x) skips this;
- ``resume_after_prepare``: a sharded run loads its optimizer state from ``optimizer_0/`` only,
  so a 0.6.x checkpoint (which has none) resumes unsharded only;
- ``src/lerobot/configs/train.py`` ``_validate_distributed``: fp16 and PEFT under sharding;
- ``resume_after_prepare``: a ``dcp`` / ``safetensors_dcp`` run whose ``pytorch_model_fsdp_0/``
  is gone ("convert what remains with ``lerobot-convert-dcp`` or resume from a safetensors
  checkpoint"); a ``safetensors`` run without ``model.safetensors``, which ``from_pretrained``
  loads while the policy is built (seen: ``FileNotFoundError`` on a ``dcp`` checkpoint resumed
  with ``--checkpoint_format=safetensors``).
"""

from __future__ import annotations

from ckpt_tools.format import layout
from ckpt_tools.format.layout import CheckpointFormat, StepPaths
from ckpt_tools.format.record import RecordSchema, Topology, TrainingStep


def kind_refusal(paths: StepPaths, record: TrainingStep, target: Topology) -> str | None:
    """The sharded/non-sharded boundary, as LeRobot main refuses it (None: allowed)."""
    sharded_now = target.layout.sharded
    if record.schema is RecordSchema.LEROBOT and record.topology is not None:
        saved = record.topology
        if saved.layout.sharded != sharded_now:
            kind = {True: "sharded", False: "non-sharded"}
            return (
                f"Cannot resume: the checkpoint was written with a {kind[saved.layout.sharded]} topology"
                f" (dp_replicate={saved.dp_replicate}, dp_shard={saved.dp_shard}) but this run is"
                f" {kind[sharded_now]} (dp_replicate={target.dp_replicate}, dp_shard={target.dp_shard})"
                " - LeRobot reshards across sizes, not across kinds"
            )
    if record.is_legacy and sharded_now:
        return (
            f"{paths.optimizer_dcp}: missing - LeRobot resumes a sharded run's optimizer state from DCP shards only,"
            f" and this 0.6.x checkpoint holds it in {layout.OPTIMIZER_STATE}; resume it unsharded"
            " (--parallelism.dp_shard=1)"
        )
    return None


def setting_refusals(target: Topology, *, mixed_precision: str | None, peft: bool) -> list[str]:
    """``_validate_distributed``'s refusals of a sharded run (one line each)."""
    if not target.layout.sharded:
        return []
    out = []
    if mixed_precision == "fp16":
        out.append(
            "fp16 is not supported under sharded training (GradScaler over DTensor gradients is unverified);"
            " use bf16 or full precision"
        )
    if peft:
        out.append("PEFT is not supported under sharded training yet")
    return out


def missing_weights(paths: StepPaths, checkpoint_format: str | None) -> str | None:
    """The weights LeRobot's resume reads are not there (None: they are, or the format is unknown).

    The resumed run's ``checkpoint_format`` picks them: the DCP shards for ``dcp`` /
    ``safetensors_dcp`` (``resume_after_prepare``), else ``model.safetensors``, which
    ``from_pretrained`` loads while the policy is built.
    """
    try:
        fmt = CheckpointFormat(checkpoint_format) if checkpoint_format else None
    except ValueError:
        return None
    if fmt is None:
        return None
    if not fmt.has_dcp:
        if paths.model_weights.exists():
            return None
        return f"{paths.model_weights}: missing - a checkpoint_format={fmt.value} resume loads the weights from it" + (
            " (this checkpoint holds DCP shards: resume with its own checkpoint_format)"
            if paths.model_dcp.is_dir()
            else ""
        )
    if paths.model_dcp.is_dir():
        return None
    return (
        f"checkpoint_format={fmt.value} declares DCP model shards, but {paths.model_dcp} is missing. If the shards"
        " were pruned, convert what remains with `lerobot-convert-dcp` or resume from a safetensors checkpoint"
    )
