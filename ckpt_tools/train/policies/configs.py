"""Policy configurations: one dataclass per ``--policy.type``, selectable with draccus.

A policy config is saved as ``pretrained_model/config.json`` and embedded in
``train_config.json``. The dataset-dependent sizes (``state_dim``, ``action_dim``) are
filled in from the dataset before anything is saved, so the saved config is what ran.
"""

from __future__ import annotations

from dataclasses import dataclass

import draccus


@dataclass
class PolicyConfig(draccus.ChoiceRegistry):
    # Start from a saved policy (local dir or Hub id); its config.json replaces these defaults.
    path: str | None = None
    # Push the final pretrained_model/ to this Hub model repo at the end of training.
    repo_id: str | None = None
    private: bool = False
    state_dim: int | None = None
    action_dim: int | None = None
    # Output chunk loss weights are uniform; padded steps past an episode end are masked.
    chunk_size: int = 10
    dropout: float = 0.1

    @property
    def type(self) -> str:
        name = self.get_choice_name(type(self))
        assert isinstance(name, str)
        return name


@PolicyConfig.register_subclass("act")
@dataclass
class ACTConfig(PolicyConfig):
    """A small ACT-style transformer: state tokens → encoder → chunk queries → decoder → actions."""

    dim_model: int = 64
    n_heads: int = 4
    dim_feedforward: int = 256
    n_encoder_layers: int = 2
    n_decoder_layers: int = 1
    n_obs_tokens: int = 4


@PolicyConfig.register_subclass("act_tied")
@dataclass
class TiedACTConfig(ACTConfig):
    """ACT whose action head shares its weight with an action-embedding table (tied weights)."""


@PolicyConfig.register_subclass("mlp")
@dataclass
class MLPConfig(PolicyConfig):
    """A plain MLP policy that declares no FSDP wrap units (exercises the start-up refusal)."""

    hidden_dim: int = 128
    n_layers: int = 3
