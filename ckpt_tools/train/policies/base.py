"""What every policy shares: config.json + model.safetensors persistence and the loss contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import draccus
import torch
from safetensors.torch import load_file
from torch import nn

from ckpt_tools.errors import CheckpointError
from ckpt_tools.format import layout
from ckpt_tools.io.fsutil import write_json_atomic
from ckpt_tools.io.safe_read import read_json_file
from ckpt_tools.train.policies.configs import PolicyConfig
from ckpt_tools.train.safetensors_io import save_state_dict


class PreTrainedPolicy(nn.Module):
    """Base class. Subclasses set ``config_class`` and may declare ``_fsdp_wrap_modules``.

    ``forward(batch)`` returns ``(loss, info)`` on normalized inputs; the pre/post
    processors (``processors.py``) own normalization, so the module holds only weights.
    """

    config_class: ClassVar[type[PolicyConfig]]

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        if config.state_dim is None or config.action_dim is None:
            raise ValueError("policy config needs state_dim and action_dim (filled from the dataset)")
        self.config = config

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        pred = self.predict_action_chunk(batch)
        target = batch["action"]
        mask = ~batch["action_is_pad"]
        l1 = (pred.float() - target.float()).abs().mean(dim=-1)
        loss = (l1 * mask).sum() / mask.sum().clamp(min=1)
        return loss, {}

    def predict_action_chunk(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def parameter_count(cls, config: PolicyConfig) -> int | None:
        """How many parameters ``cls(config)`` will hold, computed without building it (None: unknown).

        Start-up compares what the parameters, gradients and optimizer state will take with the
        memory available before anything is allocated (:mod:`ckpt_tools.train.policies.size`);
        each policy states its own count, next to the layers it builds.
        """
        return None

    @classmethod
    def activation_bytes(cls, config: PolicyConfig, batch_size: int) -> int | None:
        """A lower bound of what one training step's forward keeps for the backward, in bytes (None: unknown).

        A batch or a sequence length that asks for more than the machine holds would otherwise
        pass start-up and die in the allocator in the first forward.
        """
        return None

    def save_pretrained(self, directory: Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Write config.json and model.safetensors (fp32 master weights unless given otherwise)."""
        directory.mkdir(parents=True, exist_ok=True)
        save_policy_config(self.config, directory)
        save_state_dict(state_dict if state_dict is not None else self.state_dict(), directory / layout.MODEL_WEIGHTS)


def save_policy_config(config: PolicyConfig, directory: Path) -> None:
    write_json_atomic(directory / layout.POLICY_CONFIG, policy_config_to_dict(config))


def policy_config_to_dict(config: PolicyConfig) -> dict[str, Any]:
    encoded = draccus.encode(config, PolicyConfig)
    assert isinstance(encoded, dict)
    return encoded


def load_policy_config(directory: Path) -> PolicyConfig:
    path = directory / layout.POLICY_CONFIG
    data = read_json_file(path, missing="missing (a saved policy needs its config.json)")
    try:
        config = draccus.decode(PolicyConfig, data)
    except Exception as e:  # draccus raises several types for a foreign config
        raise CheckpointError(f"{path}: not a policy config this version understands ({e})") from None
    assert isinstance(config, PolicyConfig)
    return config


def load_weights(policy: nn.Module, weights_file: Path) -> None:
    """Load a full (gathered) state dict into an unsharded policy, strictly."""
    if not weights_file.exists():
        raise CheckpointError(f"{weights_file}: missing")
    state = load_file(str(weights_file))
    missing, unexpected = policy.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights_file}: does not match the policy (missing {list(missing)[:3]}, unexpected {list(unexpected)[:3]})"
        )
