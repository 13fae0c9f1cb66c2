"""What a resume builds before its load, in-process: the same structure torch's way would give,
without its work (no random init of weights the load overwrites, no optimizer step to make the
optimizer's state). That the values then come out bit-exact is tests/train/test_train_resume.py's."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from ckpt_tools.format.record import Layout
from ckpt_tools.train.checkpoint.state_dicts import allocate_adam_slots, optimizer_state_to_load
from ckpt_tools.train.parallel.wrap import ParallelModel
from ckpt_tools.train.policies import skip_init
from ckpt_tools.train.policies.configs import ACTConfig, TiedACTConfig
from ckpt_tools.train.policies.registry import make_policy


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.LayerNorm(5), nn.Linear(5, 2))
    model[1].weight.requires_grad_(False)  # a frozen parameter gets no slots either way
    return model


@pytest.mark.parametrize("amsgrad", [False, True])
def test_allocated_slots_give_torch_s_state_dict(amsgrad: bool) -> None:
    """The template a DCP load fills: keys, shapes, dtypes and devices as torch's lazy init makes them."""
    by_torch_model, ours_model = _model(), _model()

    def adamw(model: nn.Module) -> torch.optim.AdamW:
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=0.1, weight_decay=0.01, amsgrad=amsgrad)

    by_torch_opt, ours_opt = adamw(by_torch_model), adamw(ours_model)
    by_torch = get_optimizer_state_dict(by_torch_model, by_torch_opt)  # torch runs a step on zero gradients
    ours = optimizer_state_to_load(ParallelModel(ours_model, ours_model, Layout.SINGLE, 1, 1), ours_opt)
    assert ours["param_groups"] == by_torch["param_groups"]
    assert set(ours["state"]) == set(by_torch["state"]) and len(ours["state"]) == 5
    for name, slots in by_torch["state"].items():
        assert set(ours["state"][name]) == set(slots), name
        for slot, value in slots.items():
            mine = ours["state"][name][slot]
            assert (mine.shape, mine.dtype, mine.device) == (value.shape, value.dtype, value.device), (name, slot)
    # Nothing was computed: the parameters are untouched and no gradient is left behind.
    for a, b in zip(by_torch_model.parameters(), ours_model.parameters(), strict=True):
        assert torch.equal(a, b) and b.grad is None


def test_slots_are_left_to_torch_for_another_optimizer_or_existing_state() -> None:
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert not allocate_adam_slots(sgd) and not sgd.state
    adamw = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    assert allocate_adam_slots(adamw)
    assert not allocate_adam_slots(adamw)  # already there: a loaded or trained state is never replaced


def _act(config_class: type = ACTConfig) -> ACTConfig:
    return config_class(state_dim=3, action_dim=2, dim_model=16, dim_feedforward=32, n_heads=2, chunk_size=4)


def test_a_resumed_policy_is_built_on_meta_and_materialized_uninitialized() -> None:
    config = _act()
    model = skip_init.build_on_meta(lambda: make_policy(config))
    assert model is not None and skip_init.is_on_meta(model)
    expected = {n: p.shape for n, p in make_policy(config).named_parameters()}
    skip_init.materialize(model, torch.device("cpu"))
    assert not skip_init.is_on_meta(model)
    assert {n: p.shape for n, p in model.named_parameters()} == expected


def test_policies_the_checkpoint_cannot_fill_keep_their_ordinary_build() -> None:
    """Tied weights would be untied by materializing; a non-persistent buffer is never saved."""
    assert skip_init.build_on_meta(lambda: make_policy(_act(TiedACTConfig))) is None

    class WithTable(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(2, 2)
            self.register_buffer("table", torch.arange(4.0), persistent=False)

    assert skip_init.build_on_meta(WithTable) is None
    assert skip_init.skips_init(resuming=True, peft=False, from_path=False)
    assert not skip_init.skips_init(resuming=False, peft=False, from_path=False)
    assert not skip_init.skips_init(resuming=True, peft=True, from_path=True)
    assert not skip_init.skips_init(resuming=True, peft=False, from_path=True)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_chunks_read_straight_into_their_tensors_come_back_bit_exact(tmp_path, monkeypatch) -> None:
    """The direct read of a DCP load: every dtype's bytes as torch's own load gives them, bytes items through torch."""
    import torch.distributed.checkpoint as dcp

    from ckpt_tools.train.checkpoint.dcp_io import dcp_load
    from ckpt_tools.train.checkpoint.safe_dcp import DirectFileSystemReader

    direct: list[str] = []
    read_into = DirectFileSystemReader._read_into

    def counted(self, fd, stream, item, planner) -> bool:  # type: ignore[no-untyped-def]
        taken = read_into(self, fd, stream, item, planner)
        if taken:
            direct.append(item.dest_index.fqn)
        return taken

    monkeypatch.setattr(DirectFileSystemReader, "_read_into", counted)

    torch.manual_seed(0)
    saved = {
        "w": torch.randn(6, 5),
        "h": torch.randn(7).to(torch.bfloat16),
        "n": torch.arange(4, dtype=torch.int64),
        "step": torch.tensor(3.0),
        "lr": 0.25,  # a bytes item: torch's path, data-only
    }
    dcp.save({"model": saved}, checkpoint_id=str(tmp_path / "d"), no_dist=True)
    target = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0.0 for k, v in saved.items()}
    keep = {k: v for k, v in target.items() if isinstance(v, torch.Tensor)}
    reads = dcp_load({"model": target}, tmp_path / "d", tmp_path)
    assert sum(reads.values()) > 0
    for key, value in saved.items():
        if isinstance(value, torch.Tensor):
            assert target[key] is keep[key] and torch.equal(target[key], value), key  # loaded in place
        else:
            assert target[key] == value
    assert sorted(direct) == ["model.h", "model.n", "model.step", "model.w"]  # every tensor, not the bytes item
