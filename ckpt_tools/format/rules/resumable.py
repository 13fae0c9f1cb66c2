"""Whether a checkpoint can be resumed at all, and by which trainer, decided once for the trainer and the tools.

A checkpoint is continued by the trainer whose policy it holds (:func:`checkpoint_trainer`):
``ckpt-train``'s own checkpoints by ``ckpt-train``; checkpoints LeRobot wrote - a LeRobot record
(:class:`~ckpt_tools.format.record.RecordSchema`) or a LeRobot policy config - by LeRobot's
``lerobot-train``, since ``ckpt-train`` builds only its own policies and cannot use LeRobot's
training state (:mod:`ckpt_tools.format.lerobot`: its flat optimizer state names no parameters,
its RNG state is one process's; ckpt-train writes LeRobot's forms plus those). ``ckpt-train`` refuses a
LeRobot checkpoint with one line saying so; ``verify-resume`` and ``reshard-plan`` predict
LeRobot's resume for it (``--trainer ckpt-train`` asks about ours).

Refused outright, each with its own plain message:

- by ``ckpt-train``: a LeRobot checkpoint; the 0.6.x layout (``training_step.json`` with
  ``num_processes`` and no topology); a sharded checkpoint without any optimizer state
  (``optimizer_0/`` deleted or never written); a record without a data position;
- by LeRobot (main, ``src/lerobot/common/train_utils.py`` ``resume_after_prepare``): a LeRobot
  0.6.x FSDP checkpoint - its optimizer state is one gathered file keyed by parameter name,
  which LeRobot now reads neither on a sharded run (DCP ``optimizer_0/`` only) nor on an
  unsharded one (``int(<index>)`` of every key); a sharded checkpoint without optimizer state.

Each still loads as a pretrained policy, which the message says. What only the resumed
topology decides (LeRobot's sharded/unsharded boundary) is :mod:`.lerobot_resume`'s.

And one rule for whether a resume is *bit-exact*: :func:`master_copy_problem` - the weights a
resume reads must be the copy training holds, not one cast to another dtype (``convert-dcp
--dtype bf16`` of fp32 master weights): loading casts them back silently, and the resumed run
continues from rounded weights.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from ckpt_tools.errors import CkptError
from ckpt_tools.format import layout, lerobot
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.record import RecordSchema, TrainingStep
from ckpt_tools.io.safe_read import read_json_file


class Trainer(str, enum.Enum):
    """Who resumes a checkpoint."""

    CKPT_TRAIN = "ckpt-train"
    LEROBOT = "lerobot-train"  # LeRobot main's trainer, whose resume rules are read from its source

    @property
    def command(self) -> str:
        return f"{self.value} --resume=true"


def checkpoint_trainer(paths: StepPaths, record: TrainingStep) -> Trainer:
    """The trainer whose checkpoint ``paths`` is: the one that builds its policy and reads its state files."""
    if record.schema is RecordSchema.LEROBOT or lerobot.is_lerobot_policy(paths.pretrained_model):
        return Trainer.LEROBOT
    return Trainer.CKPT_TRAIN


@dataclass(frozen=True)
class LerobotState:
    """What a LeRobot checkpoint's state files say of the trainer that wrote them (read by
    :func:`ckpt_tools.facts.resumable.lerobot_state`; the refusal of such a checkpoint names them)."""

    optimizer_by_name: bool | None = None  # the flat optimizer state: keyed by name, by position, or not there
    one_process_rng: bool = False  # the RNG state is one process's Python, NumPy and torch generators


def needs_lerobot_state(paths: StepPaths, record: TrainingStep, trainer: Trainer) -> bool:
    """Whether :func:`unresumable_reason` names a LeRobot checkpoint's state (``ckpt-train`` refusing it)."""
    return trainer is Trainer.CKPT_TRAIN and checkpoint_trainer(paths, record) is Trainer.LEROBOT


def unresumable_reason(
    paths: StepPaths,
    record: TrainingStep,
    *,
    has_optimizer: bool,
    lerobot_state: LerobotState,
    trainer: Trainer = Trainer.CKPT_TRAIN,
) -> str | None:
    """One line saying why ``trainer`` can never resume ``paths``, or None when its layout can be.

    ``has_optimizer``: whether the loader finds optimizer state to read, the manifest's choice
    (``manifest.choose(manifest.optimizer_inputs(), paths)``; the manifest needs these rules, so
    the caller asks it): a DCP directory counts only once its ``.metadata`` is written.
    ``record``: as :func:`ckpt_tools.facts.record.read_record` completes it from the files.
    ``lerobot_state``: where :func:`needs_lerobot_state`, what its state files say
    (:func:`ckpt_tools.facts.resumable.unresumable_reason` reads it and calls this).
    """
    if trainer is Trainer.LEROBOT:
        return _lerobot_reason(paths, record, has_optimizer)
    if checkpoint_trainer(paths, record) is Trainer.LEROBOT:
        return lerobot_checkpoint_refusal(paths, record, lerobot_state)
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


def lerobot_checkpoint_refusal(paths: StepPaths, record: TrainingStep, state: LerobotState) -> str:
    """Why ``ckpt-train`` does not resume a checkpoint LeRobot wrote - what in it is LeRobot's - and what does."""
    policy = _policy_type(paths)
    theirs = [f"its policy is LeRobot's {policy or 'own'} (ckpt-train builds only its own act, act_tied and mlp)"]
    keyed = state.optimizer_by_name
    if keyed is not None:
        how = "parameter name (state/<name>/<slot>)" if keyed else "position (state/<index>/<slot>)"
        theirs.append(f"its optimizer state is keyed by {how}, its param groups a bare list")
    if state.one_process_rng:
        theirs.append("its RNG state is one process's Python, NumPy and torch generators")
    if record.is_legacy:
        era = f"a LeRobot 0.6.x checkpoint (training_step.json with num_processes; {_legacy_layout(record)})"
        resume = (
            "only LeRobot 0.6.x, which wrote it, resumes it (current LeRobot does not read optimizer state keyed by"
            " parameter name)"
            if record.sharded
            else f"LeRobot resumes it: lerobot-train --resume=true --config_path={paths.train_config}"
        )
    else:
        era = "a LeRobot checkpoint (training_step.json with a parallelism snapshot)"
        resume = f"LeRobot resumes it: lerobot-train --resume=true --config_path={paths.train_config}"
    return (
        f"{paths.root}: {era} cannot be resumed by ckpt-train: {'; '.join(theirs)}; {resume}; its weights load as"
        f" a pretrained policy in LeRobot: lerobot-train --policy.path={paths.pretrained_model}"
    )


def _lerobot_reason(paths: StepPaths, record: TrainingStep, has_optimizer: bool) -> str | None:
    """Why LeRobot main's resume can never continue ``paths`` (whatever the resumed topology), or None."""
    if checkpoint_trainer(paths, record) is Trainer.CKPT_TRAIN:
        policy = _policy_type(paths)
        return (
            f"{paths.root}: a ckpt-train checkpoint: LeRobot does not build its {policy or ''} policy"
            " (ckpt-train's own, not one of LeRobot's); resume it with ckpt-train --resume=true"
            f" --config_path={paths.train_config}"
        ).replace("its  policy", "its policy")
    as_pretrained = f"its weights load as a pretrained policy: lerobot-train --policy.path={paths.pretrained_model}"
    if record.is_legacy and record.sharded:
        return (
            f"{paths.root}: a LeRobot 0.6.x FSDP checkpoint: its optimizer state is gathered into"
            f" {layout.OPTIMIZER_STATE} and keyed by parameter name (state/<name>/<slot>), which current LeRobot"
            f" reads neither on a sharded run (DCP {layout.OPTIMIZER_DCP_DIR}/ only) nor on an unsharded one (state"
            " keyed by position only), so only LeRobot 0.6.x, which wrote it, can resume it"
            f" (lerobot-train --resume=true); {as_pretrained}"
        )
    if record.sharded and not has_optimizer:
        what = f"no {layout.DCP_METADATA} (its save did not complete)" if paths.optimizer_dcp.is_dir() else "missing"
        return (
            f"{paths.optimizer_dcp}: {what} - this sharded checkpoint holds no optimizer state and cannot be"
            f" resumed; {as_pretrained}"
        )
    return None


def _legacy_layout(record: TrainingStep) -> str:
    if record.topology is None:
        return f"num_processes={record.legacy_num_processes}"
    return f"{record.topology.describe()}, as its optimizer state's keys say"


def _policy_type(paths: StepPaths) -> str | None:
    try:
        config = read_json_file(paths.policy_config, want_object=True)
    except CkptError:
        return None
    value = config.get("type")
    return value if isinstance(value, str) else None


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
