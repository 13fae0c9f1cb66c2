"""Laying the model out over the processes: DDP, FSDP2 or HSDP, with torch's own APIs.

Accelerate's FSDP2 path does not shard on CPU, so this module uses
``fully_shard`` + ``init_device_mesh`` directly - one code path for gloo on CPU and NCCL
on CUDA. Wrap units come from the policy's ``_fsdp_wrap_modules``, from
``--accelerator.fsdp.wrap_modules`` or from ``--accelerator.fsdp.min_num_params``; a sharded
run with none of them is refused rather than silently wrapping only the root.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ckpt_tools.errors import ConfigError
from ckpt_tools.format.peft_keys import PEFT_MODEL_PREFIX
from ckpt_tools.format.record import Layout, layout_for
from ckpt_tools.format.rules.ignored_modules import ignored_regex, module_is_ignored
from ckpt_tools.train.config import FSDPConfig
from ckpt_tools.train.parallel.distributed import DistEnv, bound_by_collective_timeout
from ckpt_tools.train.parallel.precision import PrecisionPlan


@dataclass
class ParallelModel:
    """The wrapped model and what was decided about its layout."""

    module: nn.Module  # what forward is called on (DDP wrapper, FSDP root, or the policy)
    inner: nn.Module  # the policy (or PEFT model) itself, for state dicts and saving
    layout: Layout
    dp_replicate: int
    dp_shard: int
    mesh: Any = None
    wrap_units: list[str] = field(default_factory=list)  # module paths wrapped as FSDP units
    wrap_classes: list[str] = field(default_factory=list)
    ignored_params: list[nn.Parameter] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # one line each, printed after the banner

    @property
    def sharded(self) -> bool:
        return self.layout.sharded

    def set_gradient_sync(self, enabled: bool) -> Any:
        """A context for one micro-step: gradients are reduced only on the last of a window."""
        import contextlib

        wrapper: Any = self.module  # DDP or an FSDP2 root: methods nn.Module does not declare
        if self.layout is Layout.DDP and not enabled:
            return wrapper.no_sync()
        if self.sharded:
            wrapper.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()


def select_wrap_units(
    model: nn.Module, policy_class: type, fsdp: FSDPConfig
) -> tuple[list[tuple[str, nn.Module]], str]:
    """The submodules to shard as units (deepest first) and a description of the rule."""
    if fsdp.min_num_params is not None:
        return _units_by_size(model, fsdp.min_num_params), f"every submodule ≥ {fsdp.min_num_params:,} params"
    names = fsdp.wrap_modules or getattr(policy_class, "_fsdp_wrap_modules", None)
    if not names:
        raise ConfigError(
            f"the {policy_class.__name__} policy declares no _fsdp_wrap_modules: pass"
            " --accelerator.fsdp.wrap_modules='[\"ClassName\"]' or --accelerator.fsdp.min_num_params=N"
            " (wrapping only the root would give up the memory savings of sharding)"
        )
    units = [(path, m) for path, m in model.named_modules() if path and type(m).__name__ in names]
    if not units:
        present = sorted({type(m).__name__ for _, m in model.named_modules()})
        flag = "--accelerator.fsdp.wrap_modules" if fsdp.wrap_modules else f"{policy_class.__name__}._fsdp_wrap_modules"
        raise ConfigError(f"{flag}={list(names)}: no such module class in the model (classes: {', '.join(present)})")
    units.sort(key=lambda item: item[0].count("."), reverse=True)
    return units, ", ".join(names)


def root_only_warning(model: nn.Module, fsdp: FSDPConfig, units: list[tuple[str, nn.Module]]) -> str | None:
    """The warning for a ``--accelerator.fsdp.min_num_params`` that no submodule reaches.

    Then the root is the only FSDP unit: every forward and backward gathers the whole model on
    every rank, which gives up what sharding saves. Not refused - it trains correctly, and a
    flag that fits a large model may be reused on a small one - but said, with the bound that
    would wrap at least one submodule.
    """
    if units or fsdp.min_num_params is None:
        return None
    largest = max((sum(p.numel() for p in m.parameters()) for path, m in model.named_modules() if path), default=0)
    return (
        f"--accelerator.fsdp.min_num_params={fsdp.min_num_params} wraps no submodule (the largest holds"
        f" {largest:,} parameters): the root is the only FSDP unit, gathered whole in every forward and"
        f" backward, so sharding saves no memory; pass a value of at most {largest}, or"
        " --accelerator.fsdp.wrap_modules"
    )


def _units_by_size(model: nn.Module, min_params: int) -> list[tuple[str, nn.Module]]:
    """Post-order: a module becomes a unit when its parameters not yet in a unit reach the bar."""
    covered: set[int] = set()
    units: list[tuple[str, nn.Module]] = []

    def visit(path: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            visit(f"{path}.{name}" if path else name, child)
        if not path:
            return
        own = [p for p in module.parameters() if id(p) not in covered]
        if sum(p.numel() for p in own) >= min_params:
            units.append((path, module))
            covered.update(id(p) for p in own)

    visit("", model)
    return units


def check_tied_weights(model: nn.Module, unit_paths: list[str]) -> None:
    """Refuse tied parameters that would land in different FSDP units, naming them.

    ``fully_shard`` cannot split one parameter across units: it silently unties them and
    the first forward then fails deep inside torch. Found here, before any step runs.
    """
    names_by_param: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_param[id(param)].append(name)
    ordered = sorted(unit_paths, key=len, reverse=True)

    def owner(name: str) -> str:
        return next((u for u in ordered if name.startswith(u + ".")), "<root>")

    for names in names_by_param.values():
        if len(names) < 2:
            continue
        owners = {n: owner(n) for n in names}
        if len(set(owners.values())) > 1:
            detail = "; ".join(f"'{n}' in unit {u}" for n, u in owners.items())
            raise ConfigError(
                f"tied weights split across FSDP wrap units: parameter '{names[1]}' is tied to '{names[0]}' ({detail});"
                " choose --accelerator.fsdp.wrap_modules so both stay in one unit (e.g. the root)"
            )


def ignored_parameters(model: nn.Module, pattern: str | None) -> tuple[list[nn.Parameter], list[str]]:
    """Parameters of modules whose path fully matches ``pattern`` (kept unsharded)."""
    regex = ignored_regex(pattern)
    if regex is None:
        return [], []
    matched = [path for path, _ in model.named_modules() if module_is_ignored(path, regex)]
    params: dict[int, nn.Parameter] = {}
    for path in matched:
        for p in model.get_submodule(path).parameters():
            params[id(p)] = p
    if not matched:
        raise ConfigError(
            f"--accelerator.fsdp.ignored_modules={pattern}: matches no module path"
            f" (paths look like 'encoder.layers.0'; with PEFT they start with '{PEFT_MODEL_PREFIX}')"
        )
    return list(params.values()), matched


def run_in_own_dtype(model: nn.Module, paths: list[str]) -> list[str]:
    """Make each ignored module (the outermost of ``paths``) compute in its parameters' dtype.

    FSDP's MixedPrecisionPolicy casts the parameters it manages, not those of ignored modules:
    those stay float32 while the activations reaching them are in ``param_dtype``, and the
    first matmul fails (``mat1 and mat2 must have the same dtype``). So an ignored module runs
    as a float32 island: floating inputs are cast to its parameters' dtype, its outputs back to
    the dtype the inputs came in, which leaves the modules around it as they were. Returns the
    paths hooked.
    """
    outermost = [p for p in paths if not any(p.startswith(q + ".") for q in paths if q != p)]
    hooked = []
    for path in outermost:
        module = model.get_submodule(path)
        dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
        if dtype is None:
            continue
        incoming: list[torch.dtype | None] = []

        def before(_m: nn.Module, args: Any, kwargs: Any, dtype: torch.dtype = dtype, seen: list = incoming) -> Any:
            seen.append(_first_float_dtype((args, kwargs)))
            return _cast_floats(args, dtype), _cast_floats(kwargs, dtype)

        def after(_m: nn.Module, _args: Any, _kwargs: Any, output: Any, seen: list = incoming) -> Any:
            back = seen.pop()
            return output if back is None else _cast_floats(output, back)

        module.register_forward_pre_hook(before, with_kwargs=True)
        module.register_forward_hook(after, with_kwargs=True)
        hooked.append(path)
    return hooked


def _first_float_dtype(value: Any) -> torch.dtype | None:
    if isinstance(value, torch.Tensor):
        return value.dtype if value.is_floating_point() else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return next((d for d in (_first_float_dtype(v) for v in items) if d is not None), None)


def _cast_floats(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, dict):
        return {k: _cast_floats(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        cast = [_cast_floats(v, dtype) for v in value]
        return type(value)(cast) if not hasattr(value, "_fields") else type(value)(*cast)
    return value


def build_mesh(env: DistEnv, dp_replicate: int, dp_shard: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    if dp_replicate > 1:
        mesh = init_device_mesh(env.device.type, (dp_replicate, dp_shard), mesh_dim_names=("dp_replicate", "dp_shard"))
    else:
        mesh = init_device_mesh(env.device.type, (dp_shard,), mesh_dim_names=("dp_shard",))
    bound_by_collective_timeout(mesh.get_all_groups())
    return mesh


def parallelize(
    model: nn.Module,
    policy_class: type,
    env: DistEnv,
    dp_replicate: int,
    dp_shard: int,
    fsdp: FSDPConfig,
    precision: PrecisionPlan,
) -> ParallelModel:
    layout = layout_for(env.world_size, dp_replicate, dp_shard)
    if layout is Layout.SINGLE:
        return ParallelModel(model, model, layout, 1, 1)
    if layout is Layout.DDP:
        notes = []
        if fsdp.ignored_modules or fsdp.cpu_offload or fsdp.wrap_modules or fsdp.min_num_params:
            notes.append("--accelerator.fsdp.* options apply to sharded runs only: ignored under DDP")
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [env.device.index] if env.device.type == "cuda" else None
        # Bit-exact resume: by default DDP rebuilds its gradient buckets after the first
        # iteration of a process, in the order the gradients became ready. The first step
        # after a resume then all-reduces in the initial buckets where the uninterrupted run
        # used the rebuilt ones; with more than two ranks the sums are taken in another order
        # and the runs drift apart (measured: DDP(4), one ulp at the second step after the
        # resume). find_unused_parameters=True keeps the initial buckets for the whole run
        # (the reducer never rebuilds them then), at the cost of one autograd-graph walk per step.
        # torch's reducer then prints, from C++ and once per rank, that no parameter was unused
        # (no Python filter reaches it): the banner says why the setting is deliberate instead.
        notes.append(
            "DDP keeps its first gradient buckets (find_unused_parameters=True) so a resume sums gradients"
            " in the same order: torch's warning about it, once per rank, is expected"
        )
        wrapped = DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=True)
        return ParallelModel(wrapped, model, layout, dp_replicate, 1, notes=notes)
    return _shard(model, policy_class, env, layout, dp_replicate, dp_shard, fsdp, precision)


def _shard(
    model: nn.Module,
    policy_class: type,
    env: DistEnv,
    layout: Layout,
    dp_replicate: int,
    dp_shard: int,
    fsdp: FSDPConfig,
    precision: PrecisionPlan,
) -> ParallelModel:
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    units, rule = select_wrap_units(model, policy_class, fsdp)
    check_tied_weights(model, [path for path, _ in units])
    ignored, ignored_paths = ignored_parameters(model, fsdp.ignored_modules)
    notes = []
    if fsdp.cpu_offload:
        # Pinned host memory needs a GPU; on a CPU-only box the policy still keeps the
        # sharded parameters, gradients and optimizer state on the host (unpinned).
        offload: Any = CPUOffloadPolicy(pin_memory=env.device.type == "cuda")
        if env.device.type == "cpu":
            notes.append("cpu_offload on a CPU device: state already lives in host memory (unpinned offload policy)")
    else:
        offload = OffloadPolicy()
    mesh = build_mesh(env, dp_replicate, dp_shard)
    kwargs: dict[str, Any] = {"mesh": mesh, "offload_policy": offload, "ignored_params": set(ignored) or None}
    if precision.uses_fsdp_policy:
        kwargs["mp_policy"] = precision.fsdp_policy()
    for _, unit in units:
        fully_shard(unit, reshard_after_forward=fsdp.reshard_after_forward, **kwargs)
    fully_shard(model, reshard_after_forward=None if fsdp.reshard_after_forward else False, **kwargs)
    if ignored_paths:
        islands = run_in_own_dtype(model, ignored_paths) if precision.uses_fsdp_policy else []
        in_fp32 = " (computed in float32, outside the mixed precision policy)" if islands else ""
        notes.append(f"unsharded (ignored_modules): {', '.join(ignored_paths)}{in_fp32}")
    root_only = root_only_warning(model, fsdp, units)
    return ParallelModel(
        module=model,
        inner=model,
        layout=layout,
        dp_replicate=dp_replicate,
        dp_shard=dp_shard,
        mesh=mesh,
        wrap_units=[path for path, _ in units],
        wrap_classes=[rule],
        ignored_params=ignored,
        notes=notes,
        warnings=[root_only] if root_only else [],
    )


def all_reduce_ignored_grads(parallel: ParallelModel) -> None:
    """Average the gradients of unsharded (ignored) parameters over all replicas by hand.

    FSDP does not manage ignored parameters, so nothing else keeps their copies in step.
    """
    for p in parallel.ignored_params:
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(dist.get_world_size())


def clip_grad_norm(parameters: list[nn.Parameter], max_norm: float, parallel: ParallelModel) -> float:
    """Clip the global gradient norm over sharded and unsharded gradients alike.

    For a DTensor gradient the local shard's squared sum is summed over the shard group
    only (replicated mesh dims already hold the same values); plain gradients are whole.
    Each tensor's norm is accumulated in float64 inside torch's fused ``_foreach_norm`` (no
    float64 copy of any gradient, the cost of upcasting them all halved). float64 is what makes
    layouts agree: the squares of float32 values sum almost exactly in it, so a whole tensor
    (DDP) and its shards (FSDP) give the same norm to within float64 rounding, and the clip
    coefficient, applied in float32, comes out bit-identical; per-tensor norms in float32 (what
    ``torch.nn.utils.clip_grad_norm_`` takes) differ between layouts in the 8th digit, and so do
    the runs from the first clipped step on.
    """
    from torch.distributed.tensor import DTensor, Shard

    grads = [p.grad for p in parameters if p.grad is not None]
    device = parallel_device(parameters)
    if not grads:
        return 0.0
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    sharded = torch.tensor(
        [isinstance(g, DTensor) and any(isinstance(pl, Shard) for pl in g.placements) for g in grads],
        device=device,
    )
    squares = torch.stack(torch._foreach_norm(local, 2.0, dtype=torch.float64)).square()
    sharded_sq = torch.where(sharded, squares, 0.0).sum()
    plain_sq = torch.where(sharded, 0.0, squares).sum()
    if parallel.sharded and parallel.mesh is not None:
        group = parallel.mesh.get_group("dp_shard")
        dist.all_reduce(sharded_sq, group=group)
    total = float((sharded_sq + plain_sq).sqrt())
    if max_norm > 0 and total > max_norm:
        coef = max_norm / (total + 1e-6)
        torch._foreach_mul_(local, coef)
    return total


def parallel_device(parameters: list[nn.Parameter]) -> torch.device:
    for p in parameters:
        return p.device
    return torch.device("cpu")
