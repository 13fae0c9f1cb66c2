"""Starting from a saved policy (``--policy.path``): local dir or Hub id, full or PEFT.

- ``model.safetensors`` (+ processors): loaded as is.
- ``adapter_model.safetensors`` + ``adapter_config.json`` (a PEFT run's, converted or not):
  refused, naming what to pass instead - the base it records with ``--peft.*``, or a resume
  (:func:`ckpt_tools.format.policy_path.adapter_refusal`; a PEFT run's own base is
  ``train_config.json``'s ``policy.path``, a full policy).
- only ``pytorch_model_fsdp_0/`` (a ``dcp`` checkpoint): refused with the command to run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpt_tools.errors import CheckpointError, ConfigError
from ckpt_tools.format import layout
from ckpt_tools.format.policy_path import adapter_refusal, locate_policy, policy_weights
from ckpt_tools.io.safe_read import read_json_file
from ckpt_tools.train.data.processors import Pipeline
from ckpt_tools.train.policies.base import PreTrainedPolicy, load_weights


def resolve_policy_dir(path: str) -> Path:
    """A local directory (a step, ``last``, a run dir: that step's pretrained_model/) or a Hub model id."""
    try:
        located = locate_policy(path)
    except CheckpointError as e:
        raise ConfigError(f"--policy.path={e}") from None
    if isinstance(located, Path):
        return located
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(located, repo_type="model"))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
        raise ConfigError(f"--policy.path={path}: could not be fetched from the Hub ({type(e).__name__})") from None


def saved_policy_config(directory: Path) -> dict[str, Any]:
    config = directory / layout.POLICY_CONFIG
    if not config.exists():
        raise ConfigError(f"--policy.path={directory}: no {layout.POLICY_CONFIG} (not a saved policy)")
    data = read_json_file(config, error=ConfigError)
    if not isinstance(data, dict) or "type" not in data:
        raise ConfigError(f"{config}: not a policy config (no 'type')")
    return data


def load_pretrained_into(
    policy: PreTrainedPolicy, directory: Path, pre: Pipeline, post: Pipeline
) -> tuple[Pipeline, Pipeline]:
    weights = policy_weights(directory)
    refusal = adapter_refusal(str(directory), directory)
    if refusal is not None:
        raise ConfigError(refusal)
    if weights is not None:
        load_weights(policy, weights.path)
    elif (directory / layout.MODEL_DCP_DIR).is_dir():
        raise ConfigError(
            f"--policy.path={directory}: holds only DCP shards ({layout.MODEL_DCP_DIR}/);"
            f" run `ckpt-tools convert-dcp --checkpoint-dir {directory}` first"
        )
    else:
        raise ConfigError(f"--policy.path={directory}: no {layout.MODEL_WEIGHTS}")
    if (directory / f"{layout.PREPROCESSOR}.json").exists():
        pre = Pipeline.load(directory, layout.PREPROCESSOR)
    if (directory / f"{layout.POSTPROCESSOR}.json").exists():
        post = Pipeline.load(directory, layout.POSTPROCESSOR)
    return pre, post
