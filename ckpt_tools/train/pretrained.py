"""Starting from a saved policy (``--policy.path``): local dir or Hub id, full or PEFT.

- ``model.safetensors`` (+ processors): loaded as is.
- ``adapter_model.safetensors`` + ``adapter_config.json`` (a converted PEFT run): the base
  is loaded from the path the adapter config records, the adapter on top, then merged, so
  the run starts from the adapted weights.
- only ``pytorch_model_fsdp_0/`` (a ``dcp`` checkpoint): refused with the command to run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpt_tools.errors import CheckpointError, ConfigError
from ckpt_tools.format import layout
from ckpt_tools.format.policy_path import locate_policy, policy_weights
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
    if weights is not None and not weights.adapter:
        load_weights(policy, weights.path)
    elif weights is not None:
        _load_merged_adapter(policy, directory)
    elif (directory / layout.MODEL_DCP_DIR).is_dir():
        raise ConfigError(
            f"--policy.path={directory}: holds only DCP shards ({layout.MODEL_DCP_DIR}/);"
            f" run `ckpt-tools convert-dcp --checkpoint-dir {directory}` first"
        )
    else:
        raise ConfigError(f"--policy.path={directory}: no {layout.MODEL_WEIGHTS} or {layout.ADAPTER_WEIGHTS}")
    if (directory / f"{layout.PREPROCESSOR}.json").exists():
        pre = Pipeline.load(directory, layout.PREPROCESSOR)
    if (directory / f"{layout.POSTPROCESSOR}.json").exists():
        post = Pipeline.load(directory, layout.POSTPROCESSOR)
    return pre, post


def adapter_base_path(directory: Path) -> Path:
    """The base model an adapter was trained on, as recorded in ``adapter_config.json``."""
    config = directory / layout.ADAPTER_CONFIG
    data = read_json_file(config, error=ConfigError)
    base = data.get("base_model_name_or_path") if isinstance(data, dict) else None
    if not base:
        raise ConfigError(f"{config}: records no base_model_name_or_path")
    base_dir = resolve_policy_dir(str(base))
    weights = policy_weights(base_dir)
    if weights is None or weights.adapter:
        raise ConfigError(f"{config}: base model {base} has no {layout.MODEL_WEIGHTS}")
    return base_dir


def _load_merged_adapter(policy: PreTrainedPolicy, directory: Path) -> None:
    from peft import PeftModel

    base = policy_weights(adapter_base_path(directory))
    assert base is not None  # adapter_base_path checked it
    load_weights(policy, base.path)
    merged = PeftModel.from_pretrained(policy, str(directory)).merge_and_unload()
    policy.load_state_dict(merged.state_dict())
