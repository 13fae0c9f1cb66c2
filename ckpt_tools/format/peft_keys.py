"""PEFT adapter key names: from the live model's state dict to peft's saved-adapter convention.

A PEFT model's parameters carry the adapter name (``...lora_A.default.weight``,
``...head.modules_to_save.default.weight``); ``adapter_model.safetensors`` as written by
``save_pretrained`` / ``get_peft_model_state_dict`` does not (``...lora_A.weight``,
``...head.weight``), and ``PeftModel.from_pretrained`` expects the latter. This mirrors
peft's own rule (``_remove_adapter_name_from_state_dict_key`` and ``ModulesToSaveWrapper``)
so a converted DCP adapter loads exactly like a gathered one - without importing peft.
"""

from __future__ import annotations

import re

DEFAULT_ADAPTER = "default"
PEFT_MODEL_PREFIX = "base_model.model."  # what PeftModel puts before the wrapped policy's module paths
ADAPTER_MARKERS = ("lora_", "modules_to_save.")


def looks_like_adapter(keys: list[str]) -> bool:
    """True when the state dict holds only adapter-style keys (and at least one LoRA key)."""
    return bool(keys) and any("lora_" in k for k in keys) and all(any(m in k for m in ADAPTER_MARKERS) for k in keys)


def saved_adapter_key(key: str, adapter_name: str = DEFAULT_ADAPTER) -> str:
    """``base_model.model.x.lora_A.default.weight`` → ``base_model.model.x.lora_A.weight``."""
    marker = f".modules_to_save.{adapter_name}."
    if marker in key:
        return key.replace(marker, ".", 1)
    if "." not in key:
        return key
    if key.endswith(f".{adapter_name}"):
        return key.removesuffix(f".{adapter_name}")
    head, _, suffix = key.rpartition(".")
    head = re.sub(re.escape(f".{adapter_name}") + r"$", "", head)
    return f"{head}.{suffix}"
