"""What ``ckpt-train`` checks before its first step, without a process group, a device or a byte of weights.

The trainer checks its command line first (the config, the checkpoint's files, the output
dir: :func:`ckpt_tools.train.cli` before any process group), then builds: the mesh for the
launch's world size, the dataset, the policy at the dataset's sizes, and on a resume the load
of the checkpoint's weights into it. A resume that fails in those later steps used to be
found out only by running it (a dataset whose features changed: exit 2 after the process group;
a checkpoint whose tensors do not fit: exit 3 in the load), and ``verify-resume``, which cannot
run them, called it resumable.

:func:`build_checks` runs those steps the way the trainer runs them, with the same functions,
but builds the policy on the meta device (no memory, no initialization) and compares the
weights by name and shape only (:mod:`ckpt_tools.format.rules.load_plan`, which the real load
calls too). Two callers: ``ckpt-train --dry_run=true`` (every check, then exit) and
``verify-resume`` where torch is installed (its ``dataset-loads``, ``policy-builds`` and
``load-plan`` checks; the ``world`` one is its ``topology``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from ckpt_tools.check import Check
from ckpt_tools.errors import CkptError
from ckpt_tools.facts import load_plan
from ckpt_tools.format.layout import StepPaths, resolve_step
from ckpt_tools.format.rules import load_parts
from ckpt_tools.format.rules.resume_output import new_run_refusal
from ckpt_tools.train.config import TrainConfig


@dataclass(frozen=True)
class Launch:
    """The launch the checks are for: its process counts, and whether the state lives in host memory."""

    world_size: int = 1
    local_world_size: int = 1
    on_host: bool = True
    check_memory: bool = True  # this machine's memory is the launch's (not for a checkpoint judged elsewhere)


def build_checks(cfg: TrainConfig, resume_from: Path | None, launch: Launch) -> list[Check]:
    """The build steps of a launch as pass/fail checks, stopping at the first failure (the next ones need it)."""
    cfg = copy.deepcopy(cfg)  # building fills in the dataset's sizes
    checks: list[Check] = []
    try:
        dp_replicate, dp_shard = cfg.validate_for_world(launch.world_size)
    except CkptError as e:
        return [Check.fail("world", str(e))]
    checks.append(Check.ok("world", f"{launch.world_size} process(es): {dp_replicate}×{dp_shard} (replicate × shard)"))
    if resume_from is None:
        refusal = new_run_refusal(Path(str(cfg.output_dir)))
        if refusal is not None:
            return [*checks, Check.fail("output", refusal)]
    step = _dataset(cfg, checks)
    if step is None:
        return checks
    expected = _policy(cfg, step, launch, dp_shard, checks)
    if expected is not None and resume_from is None and cfg.checkpoint.load_from:
        return [*checks, _load_source_plan(cfg, expected)]
    if expected is None or resume_from is None:
        return checks
    if cfg.peft is not None:
        checks.append(Check.ok("load-plan", "not checked for a PEFT run (its checkpoint holds the adapter alone)"))
        return checks
    line = load_plan.mismatch(StepPaths(resume_from), expected)
    if line is not None:
        return [*checks, Check.fail("load-plan", line)]
    checks.append(Check.ok("load-plan", f"every one of the model's {len(expected)} tensors is saved with its shape"))
    return checks


def _load_source_plan(cfg: TrainConfig, expected: dict[str, tuple[int, ...]]) -> Check:
    """``--checkpoint.load_from``: the load-plan check for the parts chosen (the model's shapes, when it is one)."""
    assert cfg.checkpoint.load_from is not None
    parts = load_parts.parse(cfg.checkpoint.load)
    try:
        source = resolve_step(cfg.checkpoint.load_from)
    except CkptError as e:
        return Check.fail("load-plan", str(e))
    if load_parts.MODEL not in parts:
        return Check.ok("load-plan", f"{','.join(parts)} from {source.root} (no weights: the model starts fresh)")
    line = load_plan.mismatch(source, expected)
    if line is not None:
        return Check.fail("load-plan", line)
    return Check.ok(
        "load-plan",
        f"{','.join(parts)} from {source.root}: every one of the model's {len(expected)} tensors is saved with its shape",
    )


def _dataset(cfg: TrainConfig, checks: list[Check]) -> object | None:
    from ckpt_tools.train.data.dataset import load_dataset, resolve_root

    assert cfg.policy is not None
    try:
        dataset = load_dataset(
            resolve_root(cfg.dataset.root, cfg.dataset.repo_id, cfg.dataset.revision), cfg.policy.chunk_size
        )
    except CkptError as e:
        checks.append(Check.fail("dataset-loads", str(e)))
        return None
    checks.append(
        Check.ok("dataset-loads", f"{len(dataset)} samples, state {dataset.state_dim}, action {dataset.action_dim}")
    )
    return dataset


def _policy(
    cfg: TrainConfig, dataset: object, launch: Launch, dp_shard: int, checks: list[Check]
) -> dict[str, tuple[int, ...]] | None:
    """The policy built on the meta device as the trainer builds it; its tensors' shapes (None: refused)."""
    from dataclasses import replace

    from ckpt_tools.train.loop import build_policy
    from ckpt_tools.train.policies.size import require_fits

    assert cfg.policy is not None
    try:
        if launch.check_memory:
            sized = replace(cfg.policy, state_dim=dataset.state_dim, action_dim=dataset.action_dim)  # type: ignore[attr-defined]
            require_fits(
                sized,
                processes=launch.local_world_size,
                shards=dp_shard,
                peft=bool(cfg.peft),
                on_host=launch.on_host,
                batch_size=cfg.batch_size,
            )
        policy, _, _ = build_policy(cfg, dataset, resuming=True, on_meta=True)  # type: ignore[arg-type]
    except CkptError as e:
        checks.append(Check.fail("policy-builds", str(e)))
        return None
    shapes = {name: tuple(t.shape) for name, t in policy.state_dict().items()}
    count = sum(t.numel() for t in policy.parameters())
    checks.append(Check.ok("policy-builds", f"{cfg.policy.type}: {count:,} parameters (built on the meta device)"))
    return shapes
