"""Run under torchrun: lay an ACT policy out with the training core's ``parallelize`` and report
what torch really does with it.

One JSON line (rank 0) per config given, in order; each config gets a freshly built policy, so
one launch (torchrun start-up costs seconds) probes several:

- ``{"ddp": true}``: the DDP layout. Reports whether DDP rebuilt its gradient buckets in its
  first iterations (``has_rebuilt_buckets`` of its logging data), for the trainer's DDP and, as
  the control that shows the probe can see a rebuild, for a DDP with torch's defaults.
- any other object: ``FSDPConfig(**config)`` under FSDP2; reports what ``reshard_after_forward``
  and ``cpu_offload`` did.

    torchrun --standalone --nproc-per-node=2 tests/support/parallel_probe.py '{}' '{"ddp": true}'
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
        parsed = json.loads(config)
        report = probe_ddp(env) if parsed.get("ddp") else probe_fsdp(env, parsed)
        if env.is_main:
            print(json.dumps(report), flush=True)
    teardown(env)


def _policy() -> torch.nn.Module:
    from ckpt_tools.train.policies.configs import ACTConfig
    from ckpt_tools.train.policies.registry import make_policy

    torch.manual_seed(0)
    return make_policy(ACTConfig(state_dim=14, action_dim=7, dim_model=32, dim_feedforward=64, n_heads=2))


def _batch() -> dict[str, torch.Tensor]:
    return {
        "observation.state": torch.randn(4, 14),
        "action": torch.randn(4, 10, 7),
        "action_is_pad": torch.zeros(4, 10, dtype=torch.bool),
    }


def probe_ddp(env: Any) -> dict[str, Any]:
    """Did DDP rebuild its buckets in three iterations: the trainer's DDP, and torch's default one."""
    from torch.nn.parallel import DistributedDataParallel

    from ckpt_tools.train.config import FSDPConfig
    from ckpt_tools.train.parallel.precision import PrecisionPlan
    from ckpt_tools.train.parallel.wrap import parallelize

    def rebuilt(module: Any) -> bool:
        for _ in range(3):  # a rebuild happens at the second forward; the logging data shows it after the third
            loss, _ = module(_batch())
            loss.backward()
        return bool(module._get_ddp_logging_data()["has_rebuilt_buckets"])

    policy = _policy()
    parallel = parallelize(
        policy, type(policy), env, env.world_size, 1, FSDPConfig(), PrecisionPlan(mode="no", sharded=False)
    )
    assert isinstance(parallel.module, DistributedDataParallel)
    trainer = rebuilt(parallel.module)
    default = rebuilt(DistributedDataParallel(_policy()))
    return {"trainer_ddp_rebuilt_buckets": trainer, "default_ddp_rebuilt_buckets": default}


def probe_fsdp(env: Any, config: dict[str, Any]) -> dict[str, Any]:
    """What FSDP2 does to one freshly built policy under ``FSDPConfig(**config)``."""
    from ckpt_tools.train.config import FSDPConfig
    from ckpt_tools.train.parallel.precision import PrecisionPlan
    from ckpt_tools.train.parallel.wrap import parallelize

    fsdp = FSDPConfig(**config)
    policy = _policy()
    parallel = parallelize(policy, type(policy), env, 1, env.world_size, fsdp, PrecisionPlan(mode="no", sharded=True))
    unit = policy.encoder.layers[0]
    before = isinstance(unit.linear1.weight, DTensor)
    local_numel = unit.linear1.weight.to_local().numel() if before else None
    full_numel = unit.linear1.weight.numel()
    loss, _ = parallel.module(_batch())
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
