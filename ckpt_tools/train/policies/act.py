"""A tiny ACT-style policy (Action Chunking Transformer), sized by config knobs.

The same code makes a 100k-parameter model for tests and a multi-GB one for benchmarks:
``dim_model``, ``dim_feedforward`` and the layer counts scale it. The repeated blocks,
``ACTEncoderLayer`` and ``ACTDecoderLayer``, are the FSDP wrap units.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from ckpt_tools.train.policies.base import PreTrainedPolicy
from ckpt_tools.train.policies.configs import ACTConfig, PolicyConfig, TiedACTConfig


class ACTEncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ff: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(dim, ff)
        self.linear2 = nn.Linear(ff, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q = k = x + pos
        x = self.norm1(x + self.dropout(self.self_attn(q, k, x, need_weights=False)[0]))
        ff = self.linear2(self.dropout(torch.relu(self.linear1(x))))
        return self.norm2(x + self.dropout(ff))


class ACTDecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ff: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(dim, ff)
        self.linear2 = nn.Linear(ff, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor, mem_pos: torch.Tensor) -> torch.Tensor:
        q = k = x + pos
        x = self.norm1(x + self.dropout(self.self_attn(q, k, x, need_weights=False)[0]))
        attended = self.cross_attn(x + pos, memory + mem_pos, memory, need_weights=False)[0]
        x = self.norm2(x + self.dropout(attended))
        ff = self.linear2(self.dropout(torch.relu(self.linear1(x))))
        return self.norm3(x + self.dropout(ff))


class ACTEncoder(nn.Module):
    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            ACTEncoderLayer(config.dim_model, config.n_heads, config.dim_feedforward, config.dropout)
            for _ in range(config.n_encoder_layers)
        )

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, pos)
        return x


class ACTDecoder(nn.Module):
    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            ACTDecoderLayer(config.dim_model, config.n_heads, config.dim_feedforward, config.dropout)
            for _ in range(config.n_decoder_layers)
        )

    def forward(self, x: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor, mem_pos: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, memory, pos, mem_pos)
        return x


class ACTPolicy(PreTrainedPolicy):
    config_class = ACTConfig
    _fsdp_wrap_modules: ClassVar[list[str]] = ["ACTEncoderLayer", "ACTDecoderLayer"]

    def __init__(self, config: ACTConfig) -> None:
        super().__init__(config)
        assert config.state_dim is not None and config.action_dim is not None
        d = config.dim_model
        self.state_proj = nn.Linear(config.state_dim, config.n_obs_tokens * d)
        self.encoder_pos = nn.Embedding(config.n_obs_tokens, d)
        self.encoder = ACTEncoder(config)
        self.decoder_pos = nn.Embedding(config.chunk_size, d)
        self.decoder = ACTDecoder(config)
        self.action_head = nn.Linear(d, config.action_dim)

    @classmethod
    def parameter_count(cls, config: PolicyConfig) -> int | None:
        """The parameters of the layers ``__init__`` builds (the tied variant has the same: its head
        weight is the action embedding)."""
        assert isinstance(config, ACTConfig) and config.state_dim is not None and config.action_dim is not None
        d, ff, tokens = config.dim_model, config.dim_feedforward, config.n_obs_tokens
        attention = 4 * d * d + 4 * d  # in_proj (3d×d + 3d) and out_proj (d×d + d)
        feedforward = 2 * d * ff + ff + d
        encoder_layer = attention + feedforward + 2 * 2 * d  # two LayerNorms
        decoder_layer = 2 * attention + feedforward + 3 * 2 * d
        return (
            config.state_dim * tokens * d + tokens * d  # state_proj
            + tokens * d  # encoder_pos
            + config.n_encoder_layers * encoder_layer
            + config.chunk_size * d  # decoder_pos
            + config.n_decoder_layers * decoder_layer
            + d * config.action_dim + config.action_dim  # action_head
        )  # fmt: skip

    @classmethod
    def activation_bytes(cls, config: PolicyConfig, batch_size: int) -> int | None:
        """The attention scores and layer outputs each layer keeps for the backward, fp32 (a lower bound:
        no dropout masks, no intermediate sums)."""
        assert isinstance(config, ACTConfig)
        d, ff, heads = config.dim_model, config.dim_feedforward, config.n_heads
        enc, dec = config.n_obs_tokens, config.chunk_size

        def layer(queries: int, keys: int) -> int:
            return heads * queries * keys + queries * (4 * d + ff)  # scores, and q/k/v/out + feed-forward

        per_sample = config.n_encoder_layers * layer(enc, enc) + config.n_decoder_layers * (
            layer(dec, dec) + layer(dec, enc)
        )
        return batch_size * per_sample * 4

    def decoder_queries(self, batch_size: int) -> torch.Tensor:
        d = self.config.dim_model  # type: ignore[attr-defined]
        return torch.zeros(batch_size, self.config.chunk_size, d, device=self.decoder_pos.weight.device)

    def predict_action_chunk(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        state = batch["observation.state"]
        b = state.shape[0]
        d = self.config.dim_model  # type: ignore[attr-defined]
        tokens = self.state_proj(state).view(b, -1, d)
        enc_pos = self.encoder_pos.weight.unsqueeze(0)
        memory = self.encoder(tokens, enc_pos)
        dec_pos = self.decoder_pos.weight.unsqueeze(0)
        hidden = self.decoder(self.decoder_queries(b).to(memory.dtype), memory, dec_pos, enc_pos)
        return self.action_head(hidden)


class TiedActionHead(nn.Module):
    """The output projection; its weight is the action-embedding table (tied)."""

    def __init__(self, dim: int, action_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, action_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class TiedACTPolicy(ACTPolicy):
    """ACT with ``action_head.proj.weight`` tied to ``action_embedding.weight``.

    The decoder queries start from the mean action embedding. Both tied names live in the
    root unit under the default wrap units; wrapping ``TiedActionHead`` on its own splits
    the tie across units, which the training core reports at start-up.
    """

    config_class = TiedACTConfig

    def __init__(self, config: TiedACTConfig) -> None:
        super().__init__(config)
        assert config.action_dim is not None
        self.action_embedding = nn.Embedding(config.action_dim, config.dim_model)
        self.action_head = TiedActionHead(config.dim_model, config.action_dim)  # type: ignore[assignment]
        self.action_head.proj.weight = self.action_embedding.weight  # type: ignore[union-attr]  # TiedActionHead

    def decoder_queries(self, batch_size: int) -> torch.Tensor:
        query = self.action_embedding.weight.mean(dim=0)
        return query.expand(batch_size, self.config.chunk_size, -1)
