"""What ``--policy.path`` names: a saved policy on this machine, or a Hugging Face Hub model id.

The trainer loads it (the starting point of a fine-tune, the base of a PEFT run); ``reshard-plan``
and ``verify-resume`` check, before the resume, that it will find the weights there. Both resolve
the path and pick the weights file through these functions, so a path the tools accept is one
the trainer loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ckpt_tools.errors import CheckpointError, CkptError
from ckpt_tools.format import layout, manifest
from ckpt_tools.format.layout import is_hub_id, pretrained_model_dir
from ckpt_tools.io.safe_read import read_json_file


def locate_policy(path: str) -> Path | str:
    """The saved policy directory ``path`` names, or ``path`` itself when it is a Hub id (not fetched here).

    A local path naming a whole step (a step dir, ``last``, a checkpoints root, a run dir) means
    that step's ``pretrained_model/``. Raises :class:`CheckpointError`, one line starting with
    ``path``, when it is neither an existing directory nor a Hub id.
    """
    if Path(path).expanduser().exists():
        local = pretrained_model_dir(path)  # CheckpointError: a checkpoints root without a usable `last`
        if not local.is_dir():
            raise CheckpointError(f"{path}: not a directory")
        return local
    if is_hub_id(path):
        return path
    raise CheckpointError(f"{path}: no such directory (and not a Hub id like user/name)")


@dataclass(frozen=True)
class PolicyWeights:
    """The weights file a saved policy is loaded from."""

    path: Path
    adapter: bool  # a PEFT adapter: loaded onto the base its adapter_config.json names


def policy_weights(directory: Path) -> PolicyWeights | None:
    """The gathered weights in a saved policy dir: the full model's, else a PEFT adapter's (None: neither)."""
    for adapter in (False, True):
        path = directory / manifest.gathered_weights(peft=adapter).name
        if path.exists():
            return PolicyWeights(path, adapter)
    return None


def adapter_refusal(path: str, directory: Path) -> str | None:
    """Why a saved PEFT adapter is not a ``--policy.path``, and what to pass instead (None: not an adapter).

    ``--policy.path`` starts a run from full weights. An adapter dir holds only the LoRA weights
    of a frozen base: the two things a user can mean by it are a new adapter on that base (the
    base as ``--policy.path``, with ``--peft.*``) or more training of this one (a resume of the
    step it was saved at). The line names both, with the base ``adapter_config.json`` records.
    """
    weights = policy_weights(directory)
    if weights is None or not weights.adapter:
        return None
    try:
        config = read_json_file(directory / layout.ADAPTER_CONFIG, want_object=True)
        base = config.get("base_model_name_or_path") or None
    except CkptError:
        base = None
    new = f"--policy.path={base}" if isinstance(base, str) else "its base policy as --policy.path"
    step = directory.parent
    resume = ""
    if directory.name == layout.PRETRAINED_MODEL_DIR and (step / layout.TRAINING_STATE_DIR).is_dir():
        resume = f", or continue it with --resume=true --config_path={step}"
    return (
        f"--policy.path={path}: a PEFT adapter ({layout.ADAPTER_WEIGHTS}), not a full policy; to train an"
        f" adapter on its base pass {new} with --peft.method_type=LORA --peft.r=N{resume}"
    )
