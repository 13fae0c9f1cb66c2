"""Mixed precision: the FSDP2 policy, autocast for unsharded runs, and the fp16 loss scaler.

One rule everywhere: the policy is derived from ``--accelerator.mixed_precision`` unless
any ``--accelerator.fsdp.mixed_precision_policy.*`` field is set, in which case it is
built from those fields alone. An unset ``reduce_dtype`` resolves to ``param_dtype`` (what
torch < 2.15 does implicitly; torch ≥ 2.15 changed the default to the parameters' dtype),
written out explicitly so a run means the same thing on every torch version. The resolved
policy is printed in the banner and recorded in ``training_step.json``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ckpt_tools.format.record import MixedPrecisionPolicyRecord
from ckpt_tools.train.config import TrainConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class PrecisionPlan:
    mode: str  # no | bf16 | fp16
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True
    sharded: bool = False

    @property
    def uses_fsdp_policy(self) -> bool:
        return self.sharded and self.param_dtype is not None

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """Unsharded runs get mixed precision from autocast (FSDP2 runs from the policy)."""
        return None if self.sharded else MODE_DTYPES.get(self.mode)

    @property
    def needs_scaler(self) -> bool:
        return self.mode == "fp16"

    def fsdp_policy(self) -> Any:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(
            param_dtype=self.param_dtype,
            reduce_dtype=self.reduce_dtype,
            output_dtype=self.output_dtype,
            cast_forward_inputs=self.cast_forward_inputs,
        )

    def record(self) -> MixedPrecisionPolicyRecord | None:
        if not self.uses_fsdp_policy:
            return None
        return MixedPrecisionPolicyRecord(
            param_dtype=dtype_name(self.param_dtype),
            reduce_dtype=dtype_name(self.reduce_dtype),
            output_dtype=dtype_name(self.output_dtype),
            cast_forward_inputs=self.cast_forward_inputs,
        )

    def describe(self) -> str:
        if self.uses_fsdp_policy:
            return (
                f"{self.mode}: FSDP MixedPrecisionPolicy(param={dtype_name(self.param_dtype)},"
                f" reduce={dtype_name(self.reduce_dtype)}, output={dtype_name(self.output_dtype)},"
                f" cast_forward_inputs={self.cast_forward_inputs})"
                + (", fp16 loss scaler (ShardedGradScaler)" if self.needs_scaler else "")
            )
        if self.autocast_dtype is not None:
            return f"{self.mode}: autocast to {dtype_name(self.autocast_dtype)}" + (
                ", fp16 loss scaler" if self.needs_scaler else ""
            )
        return "fp32 (no mixed precision)"

    @contextlib.contextmanager
    def autocast(self, device: torch.device) -> Iterator[None]:
        if self.autocast_dtype is None:
            yield
            return
        with torch.autocast(device_type=device.type, dtype=self.autocast_dtype):
            yield


def resolve_precision(cfg: TrainConfig, sharded: bool) -> PrecisionPlan:
    mode = cfg.accelerator.mixed_precision
    explicit = cfg.accelerator.fsdp.mixed_precision_policy
    if not sharded:
        return PrecisionPlan(mode=mode, sharded=False)
    if explicit.any_set:
        assert explicit.param_dtype is not None  # config validation guarantees it
        param = DTYPES[explicit.param_dtype]
        return PrecisionPlan(
            mode=mode,
            param_dtype=param,
            reduce_dtype=DTYPES[explicit.reduce_dtype] if explicit.reduce_dtype else param,
            output_dtype=DTYPES[explicit.output_dtype] if explicit.output_dtype else None,
            cast_forward_inputs=True if explicit.cast_forward_inputs is None else explicit.cast_forward_inputs,
            sharded=True,
        )
    if mode in MODE_DTYPES:
        dtype = MODE_DTYPES[mode]
        return PrecisionPlan(mode=mode, param_dtype=dtype, reduce_dtype=dtype, sharded=True)
    return PrecisionPlan(mode=mode, sharded=True)


def make_scaler(plan: PrecisionPlan, device: torch.device) -> Any:
    """fp16 needs a loss scaler; a sharded run needs one that reduces found-inf over the world.

    The plain ``GradScaler`` checks only local gradients: on HSDP the replicas then disagree
    about skipping a step and diverge. ``ShardedGradScaler`` all-reduces the found-inf flag.
    """
    if not plan.needs_scaler:
        return None
    if plan.sharded:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=device.type)
    return torch.amp.GradScaler(device.type)
