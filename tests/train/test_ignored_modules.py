"""``--accelerator.fsdp.ignored_modules`` on the trainer's live model, in-process (no process group)."""

from __future__ import annotations

import pytest
import torch

from ckpt_tools.errors import ConfigError
from ckpt_tools.format.rules.ignored_modules import ignored_regex, parameter_is_ignored
from ckpt_tools.train.config import PeftConfig
from ckpt_tools.train.parallel.peft_support import apply_lora
from ckpt_tools.train.parallel.wrap import ignored_parameters, run_in_own_dtype
from ckpt_tools.train.policies.configs import ACTConfig
from ckpt_tools.train.policies.registry import make_policy


@pytest.fixture(scope="module")
def peft_model() -> object:
    policy = make_policy(ACTConfig(state_dim=4, action_dim=3, dim_model=16, dim_feedforward=32, n_heads=2))
    return apply_lora(policy, PeftConfig(r=2), "base")


def test_ignored_modules_take_whole_peft_module_paths(peft_model: object) -> None:
    params, paths = ignored_parameters(peft_model, r".*action_head")  # type: ignore[arg-type]
    assert paths == ["base_model.model.action_head"] and params
    with pytest.raises(ConfigError, match=r"matches no module path .*they start with 'base_model\.model\.'"):
        ignored_parameters(peft_model, "action_head")  # type: ignore[arg-type]
    assert ignored_parameters(peft_model, None) == ([], [])  # type: ignore[arg-type]


def test_reshard_plan_keeps_the_same_parameters_whole(peft_model: object) -> None:
    """The parameters the trainer leaves unsharded are those the rule says, name by name."""
    pattern = r"base_model\.model\.(action_head|encoder\.layers\.0)"
    params, _ = ignored_parameters(peft_model, pattern)  # type: ignore[arg-type]
    kept = {id(p) for p in params}
    regex = ignored_regex(pattern)
    for name, param in peft_model.named_parameters():  # type: ignore[attr-defined]
        assert parameter_is_ignored(name, regex) == (id(param) in kept), name


def test_an_ignored_module_computes_in_its_own_dtype_between_mixed_precision_layers() -> None:
    """FSDP casts what it manages to bf16, not an ignored module: that one runs in float32, transparently."""
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4).bfloat16(), torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).bfloat16()
    )
    x = torch.randn(2, 4, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="dtype"):
        model(x)
    assert run_in_own_dtype(model, ["1"]) == ["1"]
    out = model(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert model[1].weight.grad is not None and model[1].weight.grad.dtype == torch.float32
