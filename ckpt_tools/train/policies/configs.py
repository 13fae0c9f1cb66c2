"""Policy configurations: one dataclass per ``--policy.type``, selectable with draccus.

A policy config is saved as ``pretrained_model/config.json`` and embedded in
``train_config.json``. The dataset-dependent sizes (``state_dim``, ``action_dim``) are
filled in from the dataset before anything is saved, so the saved config is what ran.
"""

from __future__ import annotations

from dataclasses import dataclass

import draccus

from ckpt_tools.train.flag import flag


@dataclass
class PolicyConfig(draccus.ChoiceRegistry):
    # Start from a saved policy (local dir or Hub id); its config.json replaces these defaults.
    path: str | None = flag(
        None,
        help=(
            "Start from a saved policy (a local pretrained_model/, step dir or `last`, or a Hub id): its "
            "config.json and weights. A PEFT adapter is not a policy: pass its base with --peft.*, or resume."
        ),
    )
    # Push the final pretrained_model/ to this Hub model repo at the end of training.
    repo_id: str | None = flag(
        None, help="Publish the final pretrained_model/ to this Hub model repo (user/name) after training."
    )
    private: bool = flag(False, help="Create the --policy.repo_id repo as private.")
    state_dim: int | None = flag(
        None,
        help="Width of observation.state; filled in from the dataset (a different value is refused).",
        shown_default="from the dataset",
    )
    action_dim: int | None = flag(
        None,
        help="Width of action; filled in from the dataset (a different value is refused).",
        shown_default="from the dataset",
    )
    # Output chunk loss weights are uniform; padded steps past an episode end are masked.
    chunk_size: int = flag(
        10,
        help=(
            "Actions predicted per sample (the chunk t … t+chunk_size-1; padded steps past an episode end are"
            " masked in the loss)."
        ),
    )
    dropout: float = flag(0.1, help="Dropout probability, in [0, 1].")

    @property
    def type(self) -> str:
        name = self.get_choice_name(type(self))
        assert isinstance(name, str)
        return name


@PolicyConfig.register_subclass("act")
@dataclass
class ACTConfig(PolicyConfig):
    """A small ACT-style transformer: state tokens → encoder → chunk queries → decoder → actions."""

    dim_model: int = flag(64, help="Transformer width (must be divisible by --policy.n_heads).")
    n_heads: int = flag(4, help="Attention heads per layer.")
    dim_feedforward: int = flag(256, help="Feed-forward width of each transformer layer.")
    n_encoder_layers: int = flag(2, help="Encoder layers (ACTEncoderLayer, each one FSDP wrap unit).")
    n_decoder_layers: int = flag(1, help="Decoder layers (ACTDecoderLayer, each one FSDP wrap unit).")
    n_obs_tokens: int = flag(4, help="Tokens the state is projected to before the encoder.")


@PolicyConfig.register_subclass("act_tied")
@dataclass
class TiedACTConfig(ACTConfig):
    """ACT whose action head shares its weight with an action-embedding table (tied weights)."""


@PolicyConfig.register_subclass("mlp")
@dataclass
class MLPConfig(PolicyConfig):
    """A plain MLP policy that declares no FSDP wrap units (exercises the start-up refusal)."""

    hidden_dim: int = flag(128, help="Width of each hidden layer.")
    n_layers: int = flag(3, help="Hidden layers.")
