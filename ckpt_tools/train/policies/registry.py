"""Policy registry: ``--policy.type`` → (config class, module class).

Kept apart from the package's ``__init__`` so that parsing flags (which needs only the config
classes) does not import torch: a refused command line then costs no torch start-up.
"""

from __future__ import annotations

from pathlib import Path

from ckpt_tools.train.policies.act import ACTPolicy, TiedACTPolicy
from ckpt_tools.train.policies.base import PreTrainedPolicy, load_policy_config, load_weights
from ckpt_tools.train.policies.configs import ACTConfig, MLPConfig, PolicyConfig, TiedACTConfig
from ckpt_tools.train.policies.mlp import MLPPolicy

POLICY_CLASSES: dict[type[PolicyConfig], type[PreTrainedPolicy]] = {
    ACTConfig: ACTPolicy,
    TiedACTConfig: TiedACTPolicy,
    MLPConfig: MLPPolicy,
}


def make_policy(config: PolicyConfig) -> PreTrainedPolicy:
    return POLICY_CLASSES[type(config)](config)


def policy_from_pretrained(directory: Path) -> PreTrainedPolicy:
    """Rebuild a policy from ``config.json`` + ``model.safetensors`` (unsharded, fp32)."""
    from ckpt_tools.format import layout

    policy = make_policy(load_policy_config(directory))
    load_weights(policy, directory / layout.MODEL_WEIGHTS)
    return policy
