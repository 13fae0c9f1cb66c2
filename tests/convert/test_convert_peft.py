"""PEFT: an adapter-only DCP converts into what peft itself saves, and PeftModel loads it.

Single process on purpose: the key mapping is what is under test here (multi-rank chunk
assembly is covered by test_convert_exact), and real peft is the reference for it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from ckpt_tools.convert import convert_dcp
from ckpt_tools.format.peft_keys import saved_adapter_key


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(6, 8)
        self.linear2 = nn.Linear(8, 6)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.encoder.layers:
            x = x + block.linear2(torch.relu(block.linear1(x)))
        return self.head(x)


def base_model() -> Net:
    torch.manual_seed(0)
    return Net()


def test_adapter_dcp_converts_to_peft_save_pretrained_and_loads(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from peft import LoraConfig, PeftModel, get_peft_model

    model = get_peft_model(base_model(), LoraConfig(r=2, target_modules=["linear1"], modules_to_save=["head"]))
    torch.manual_seed(1)
    with torch.no_grad():  # lora_B starts at zero: make every adapter weight matter
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    adapter_state = {k: v for k, v in model.state_dict().items() if k in trainable}  # what the training core saves
    assert any(".lora_A.default." in k for k in adapter_state) and any("modules_to_save" in k for k in adapter_state)

    pm = tmp_path / "000002" / "pretrained_model"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: saving in a single process"
        dcp.save({"model": adapter_state}, checkpoint_id=pm / "pytorch_model_fsdp_0")
    model.peft_config["default"].save_pretrained(str(pm))
    reference = tmp_path / "reference"
    model.save_pretrained(str(reference))

    result = convert_dcp(pm, progress=False)
    assert result.plan.peft and result.output_files == (pm / "adapter_model.safetensors",)
    ours, theirs = load_file(pm / "adapter_model.safetensors"), load_file(reference / "adapter_model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    assert {saved_adapter_key(k) for k in adapter_state} == set(theirs)

    loaded = PeftModel.from_pretrained(base_model(), str(pm))
    x = torch.randn(5, 6)
    model.eval()
    loaded.eval()
    assert torch.equal(loaded(x), model(x))


def test_saved_adapter_key_follows_peft_rules() -> None:
    assert saved_adapter_key("base_model.model.a.lora_A.default.weight") == "base_model.model.a.lora_A.weight"
    assert saved_adapter_key("base_model.model.a.lora_magnitude_vector.default") == (
        "base_model.model.a.lora_magnitude_vector"
    )
    assert saved_adapter_key("base_model.model.head.modules_to_save.default.bias") == "base_model.model.head.bias"
    # a module that happens to be called like the adapter keeps its name
    assert saved_adapter_key("base_model.model.default.lora_B.default.weight") == (
        "base_model.model.default.lora_B.weight"
    )
