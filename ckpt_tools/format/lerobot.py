"""What LeRobot's own trainer (``lerobot-train``) writes, where it differs from ``ckpt-train``.

LeRobot and ``ckpt-train`` share the checkpoint layout (``checkpoints/<step>/{pretrained_model,
training_state}``, ``last``, the DCP directory names), but LeRobot fills some files its own way.
``ckpt-train`` writes ``training_state/`` in LeRobot main's forms, plus what only it reads (the
names by position of its flat optimizer state, every rank's RNG state:
:mod:`ckpt_tools.format.param_groups`, :mod:`ckpt_tools.train.checkpoint.rng`); what tells the
two apart is the record and the policy, never those files. Each fact below is read from
LeRobot's source, at the version named:

- **optimizer state of an unsharded run** (0.6.1 and main: ``optim/optimizers.py``
  ``_save_single_optimizer_state``): ``optimizer.state_dict()`` flattened by
  ``utils/utils.py`` ``flatten_dict`` with ``sep="/"``, so ``optimizer_state.safetensors`` holds
  ``state/<index>/<slot>`` (split by :func:`ckpt_tools.format.layout.split_flat_optimizer_key`) - the parameter's position in the optimizer, not its name - and
  ``optimizer_param_groups.json`` is the bare list of param groups (``"params"``: those
  positions). LeRobot 0.6.x FSDP runs (``common/train_utils.py`` ``gather_fsdp_state_dicts``:
  FSDP1 ``FULL_STATE_DICT``) wrote the same two files from the gathered optimizer state, keyed
  by parameter name: ``state/<name>/<slot>``, the groups listing names. Main writes sharded
  runs' optimizer state as DCP (``optimizer_0/``), as ``ckpt-train`` does.
- **RNG state** (``utils/random_utils.py`` ``save_rng_state``, both versions): the main
  process's generators only - Python's, NumPy's and torch's (:data:`RNG_KEYS`), plus
  ``torch_cuda_rng_state`` on CUDA machines - and every rank loads that same state on resume,
  whatever the world size.
- **LR scheduler state**: ``scheduler_state.json`` only when the run has a scheduler (the
  policy preset's, or ``--scheduler.type``); ACT's preset has none. The training config records
  it: ``"scheduler": null`` means none was saved, and none is read on resume.
- **no loss-scaler state**: LeRobot leaves fp16 scaling to accelerate and saves no
  ``scaler_state.json``.
- **the policy** is one of LeRobot's (``config.json`` is a ``PreTrainedConfig``: it always has
  ``input_features`` and ``output_features``), not one ``ckpt-train`` can build.

The ``training_step.json`` schemas are read in :mod:`ckpt_tools.format.record`; the sampler
position rule is :mod:`ckpt_tools.format.rules.sampler_position`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpt_tools.errors import CkptError
from ckpt_tools.format import layout as L
from ckpt_tools.io.safe_read import read_json_file

# serialize_rng_state(): what every LeRobot rng_state.safetensors holds (CUDA/MPS states may be added).
RNG_KEYS = (
    "py_rng_version",
    "py_rng_state",
    "np_rng_state_values",
    "np_rng_state_index",
    "np_rng_has_gauss",
    "np_rng_cached_gaussian",
    "torch_rng_state",
)
# PreTrainedConfig fields every LeRobot policy config.json has, and ckpt-train's policies never do.
POLICY_MARKERS = ("input_features", "output_features")


def is_position(owner: str) -> bool:
    """An optimizer-state owner that is a position in the optimizer (``"12"``), not a parameter name."""
    return owner.isdigit()


def keyed_by_name(keys: list[str]) -> bool | None:
    """Whether LeRobot flat optimizer ``keys`` name their parameters (a 0.6.x FSDP run) or number them.

    None when no key is in LeRobot's format (another writer, or no state at all).
    """
    owners = [L.split_flat_optimizer_key(k)[0] for k in keys if L.is_lerobot_optimizer_key(k)]
    if not owners:
        return None
    return not all(is_position(o) for o in owners)


def is_lerobot_policy(pretrained_model: Path) -> bool:
    """Whether ``pretrained_model/config.json`` is a LeRobot policy config (unreadable or absent: False)."""
    try:
        config = read_json_file(pretrained_model / L.POLICY_CONFIG, want_object=True)
    except CkptError:
        return False
    return all(marker in config for marker in POLICY_MARKERS)


def policy_fields(config: dict[str, Any]) -> list[str]:
    """The fields of a LeRobot policy ``config`` that name it as one (for a message)."""
    return [name for name in POLICY_MARKERS if name in config]


def saves_scheduler(train_config: dict[str, Any] | None) -> bool | None:
    """Whether a LeRobot run saved ``scheduler_state.json``: its training config has a scheduler.

    None when the config does not say (absent or unreadable).
    """
    if train_config is None or "scheduler" not in train_config:
        return None
    return train_config["scheduler"] is not None
