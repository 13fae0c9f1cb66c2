"""What ``--policy.path`` names: a saved policy on this machine, or a Hugging Face Hub model id.

The trainer loads it (the starting point of a fine-tune, the base of a PEFT run); ``reshard-plan``
and ``verify-resume`` check, before the resume, that it will find the weights there. Both resolve
the path and pick the weights file through these functions, so a path the tools accept is one
the trainer loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ckpt_tools.errors import CheckpointError
from ckpt_tools.format import manifest
from ckpt_tools.format.layout import pretrained_model_dir


def is_hub_id(path: str) -> bool:
    """``user/name``: how the Hub names a model (a path starting with ``/``, ``.`` or ``~`` is a local one)."""
    return path.count("/") == 1 and not path.startswith(("/", ".", "~"))


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
