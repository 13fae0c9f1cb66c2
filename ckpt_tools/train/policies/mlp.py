"""An MLP policy that declares no ``_fsdp_wrap_modules`` (sharding it needs a wrap flag)."""

from __future__ import annotations

import torch
from torch import nn

from ckpt_tools.train.policies.base import PreTrainedPolicy
from ckpt_tools.train.policies.configs import MLPConfig, PolicyConfig


class MLPBlock(nn.Module):
    def __init__(self, dim: int, dropout: float) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.dropout(torch.relu(self.linear(x))))


class MLPPolicy(PreTrainedPolicy):
    config_class = MLPConfig

    def __init__(self, config: MLPConfig) -> None:
        super().__init__(config)
        assert config.state_dim is not None and config.action_dim is not None
        self.input = nn.Linear(config.state_dim, config.hidden_dim)
        self.blocks = nn.ModuleList(MLPBlock(config.hidden_dim, config.dropout) for _ in range(config.n_layers))
        self.output = nn.Linear(config.hidden_dim, config.chunk_size * config.action_dim)

    @classmethod
    def parameter_count(cls, config: PolicyConfig) -> int | None:
        assert isinstance(config, MLPConfig) and config.state_dim is not None and config.action_dim is not None
        h, out = config.hidden_dim, config.chunk_size * config.action_dim
        block = h * h + h + 2 * h  # linear + LayerNorm
        return config.state_dim * h + h + config.n_layers * block + h * out + out

    @classmethod
    def activation_bytes(cls, config: PolicyConfig, batch_size: int) -> int | None:
        """Each block's input and output per sample, fp32 (a lower bound)."""
        assert isinstance(config, MLPConfig) and config.action_dim is not None
        return batch_size * (2 * config.n_layers * config.hidden_dim + config.chunk_size * config.action_dim) * 4

    def predict_action_chunk(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = torch.relu(self.input(batch["observation.state"]))
        for block in self.blocks:
            x = block(x)
        assert self.config.action_dim is not None
        return self.output(x).view(x.shape[0], self.config.chunk_size, self.config.action_dim)
