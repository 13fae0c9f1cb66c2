"""Run under torchrun: lay an ACT policy out with the training core's ``parallelize`` and report
what FSDP2 really does with ``reshard_after_forward`` and ``cpu_offload``.

One JSON line (rank 0) per FSDP config given, in order; each config gets a freshly built
policy, so one launch (torchrun start-up costs seconds) probes several configs:

    torchrun --standalone --nproc-per-node=2 tests/support/fsdp_probe.py '{}' '{"reshard_after_forward": false}'
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from torch.distributed.tensor import DTensor


def main() -> None:
    from ckpt_tools.train.parallel.distributed import init_distributed, teardown

    env = init_distributed()
    for config in sys.argv[1:]:
        report = probe(env, json.loads(config))
        if env.is_main:
            print(json.dumps(report), flush=True)
    teardown(env)


def probe(env: Any, config: dict[str, Any]) -> dict[str, Any]:
    """What FSDP2 does to one freshly built policy under ``FSDPConfig(**config)``."""
    from ckpt_tools.train.config import FSDPConfig
    from ckpt_tools.train.parallel.precision import PrecisionPlan
    from ckpt_tools.train.parallel.wrap import parallelize
    from ckpt_tools.train.policies.configs import ACTConfig
    from ckpt_tools.train.policies.registry import make_policy

    fsdp = FSDPConfig(**config)
    torch.manual_seed(0)
    policy = make_policy(ACTConfig(state_dim=14, action_dim=7, dim_model=32, dim_feedforward=64, n_heads=2))
    parallel = parallelize(policy, type(policy), env, 1, env.world_size, fsdp, PrecisionPlan(mode="no", sharded=True))
    unit = policy.encoder.layers[0]
    before = isinstance(unit.linear1.weight, DTensor)
    local_numel = unit.linear1.weight.to_local().numel() if before else None
    full_numel = unit.linear1.weight.numel()
    batch = {
        "observation.state": torch.randn(4, 14),
        "action": torch.randn(4, 10, 7),
        "action_is_pad": torch.zeros(4, 10, dtype=torch.bool),
    }
    loss, _ = parallel.module(batch)
    after_forward = isinstance(unit.linear1.weight, DTensor)
    group = unit._get_fsdp_state()._fsdp_param_group
    report = {
        "sharded_before_forward": before,
        "sharded_after_forward": after_forward,
        "offload_policy": type(group.offload_policy).__name__,
        "params_offloaded": all(p.offload_to_cpu for p in group.fsdp_params),
        "local_numel": local_numel,
        "full_numel": full_numel,
        "notes": parallel.notes,
    }
    loss.backward()
    return report


if __name__ == "__main__":
    main()
