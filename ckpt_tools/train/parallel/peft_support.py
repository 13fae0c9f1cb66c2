"""PEFT (LoRA) on top of a policy, before it is sharded."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ckpt_tools.errors import ConfigError
from ckpt_tools.train.config import PeftConfig

# Linear layers a LoRA adapter targets by default (the attention projections of
# nn.MultiheadAttention are used as raw weights, so LoRA cannot hook them).
DEFAULT_TARGETS = ["linear1", "linear2", "state_proj", "linear"]


def apply_lora(policy: nn.Module, cfg: PeftConfig, base_path: str) -> Any:
    """Wrap ``policy`` in a LoRA PeftModel; ``base_path`` is recorded in adapter_config.json."""
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, m in policy.named_modules() if isinstance(m, nn.Linear)}
    targets = cfg.target_modules or [t for t in DEFAULT_TARGETS if t in present]
    missing = [t for t in targets if t not in present]
    if missing:
        raise ConfigError(
            f"--peft.target_modules: {missing} not found among the policy's linear layers ({', '.join(sorted(present))})"
        )
    modules_to_save = cfg.full_training_modules or None
    if modules_to_save:
        names = {name.rsplit(".", 1)[-1] for name, _ in policy.named_modules()}
        unknown = [m for m in modules_to_save if m not in names]
        if unknown:
            raise ConfigError(f"--peft.full_training_modules: {unknown} not found in the policy")
    lora = LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.lora_alpha or cfg.r,
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
        modules_to_save=modules_to_save,
    )
    model = get_peft_model(policy, lora)
    # get_peft_model takes the base path from the model's `name_or_path`, which a policy lacks.
    model.peft_config["default"].base_model_name_or_path = base_path
    return model


def upcast_trainable(model: nn.Module) -> None:
    """FSDP2 needs one dtype per sharded group of trainable parameters: make them all fp32."""
    for param in model.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()
