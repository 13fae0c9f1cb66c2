"""Checks on the resumed run's settings: topology, precision, PEFT base, dataset, data order.

The target comes from :mod:`ckpt_tools.resume.target` (saved config merged with the flags);
its start-up refusals fail here. Everything the resume survives but that makes it differ from
an uninterrupted run - another data split, another effective batch, another precision, a
``train_config.json`` that contradicts ``training_step.json`` - is a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpt_tools.check import Check
from ckpt_tools.errors import CkptError
from ckpt_tools.format import dataset
from ckpt_tools.format import layout as L
from ckpt_tools.format.policy_path import adapter_refusal, locate_policy, policy_weights
from ckpt_tools.format.record import BatchFactorization
from ckpt_tools.format.rules.data_order import DataOrderChange
from ckpt_tools.format.rules.lerobot_features import feature_problems
from ckpt_tools.format.rules.resumable import Trainer
from ckpt_tools.format.rules.sampler_position import sampler_state
from ckpt_tools.format.rules.scaling import linear_scaling
from ckpt_tools.format.rules.startup import resolve_parallelism
from ckpt_tools.resume.source import ResumeSource
from ckpt_tools.resume.target import ResumeTarget
from ckpt_tools.st.header import read_header


def settings_checks(source: ResumeSource, target: ResumeTarget) -> list[Check]:
    lerobot_run = target.trainer is Trainer.LEROBOT
    problems = list(target.problems)
    if target.topology is None and problems:
        n = target.world_size
        where = f"{n} process{'es' if n != 1 else ''}"
        checks = [Check.fail("topology", f"{_saved(source)} → {where}: {problems.pop(0)}")]
    elif target.kind_refusal is not None:
        assert target.topology is not None
        checks = [Check.fail("topology", f"{_saved(source)} → {target.topology.describe()}: {target.kind_refusal}")]
    else:
        checks = [_topology(source, target)]
    checks += [Check.fail("start-up", problem) for problem in problems]
    if not lerobot_run:  # ckpt-train's config decoder, and the policy it loads again
        checks += _config_shape(source)
    checks.append(_config_vs_record(source))
    checks.append(_precision(source, target))
    if not lerobot_run:
        checks += _pretrained(source)
    checks.append(_lerobot_dataset(source) if lerobot_run else _dataset(source))
    checks.append(_data_order(source, target))
    checks.append(_effective_batch(source, target))
    return checks


def _saved(source: ResumeSource) -> str:
    return source.record.topology.describe() if source.record.topology else "unknown topology"


def _topology(source: ResumeSource, target: ResumeTarget) -> Check:
    saved, label = source.record.topology, _saved(source)
    now = target.topology
    assert now is not None
    if saved is not None and (saved.world_size, saved.dp_replicate, saved.dp_shard) == (
        now.world_size,
        now.dp_replicate,
        now.dp_shard,
    ):
        change = "same topology"
    else:
        change = "model and optimizer state reshard on load"
    return Check.ok("topology", f"{label} → {now.describe()} ({change})")


def _config_shape(source: ResumeSource) -> list[Check]:
    """A train_config.json the trainer's config decoder refuses stops the resume at start-up."""
    if source.config is None:
        return []
    problems = source.config.shape_problems()
    if not problems:
        return []
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    path = source.paths.train_config
    return [Check.fail("train-config", f"{path.parent.name}/{path.name}: {problems[0]}{more}")]


def _config_vs_record(source: ResumeSource) -> Check:
    """The resume runs with train_config.json's values: say so when training_step.json recorded others."""
    config, record = source.config, source.record
    if config is None:
        return Check.warn("config-vs-record", "no train_config.json to compare with training_step.json")
    differences = []
    pairs = [
        ("batch_size", config.batch_size, record.batch_size),
        ("grad_accum_steps", config.grad_accum_steps, record.grad_accum_steps),
        ("mixed_precision", config.mixed_precision, record.mixed_precision),
    ]
    if record.sharded:
        pairs.append(("checkpoint_format", config.checkpoint_format, record.checkpoint_format))
    for name, configured, recorded in pairs:
        if configured is not None and recorded is not None and configured != recorded:
            differences.append(f"{name} {configured} (config) vs {recorded} (record)")
    topo = record.topology
    if topo is not None and config.dp_replicate is not None and config.dp_shard is not None:
        resolved, _ = resolve_parallelism(config.dp_replicate, config.dp_shard, topo.world_size)
        if resolved != (topo.dp_replicate, topo.dp_shard):
            differences.append(
                f"parallelism {config.dp_replicate}×{config.dp_shard} (config) vs"
                f" {topo.dp_replicate}×{topo.dp_shard} on {topo.world_size} processes (record)"
            )
    if record.peft is not None and config.peft != record.peft:
        differences.append(f"peft {config.peft} (config) vs {record.peft} (record)")
    if differences:
        return Check.warn(
            "config-vs-record",
            "train_config.json disagrees with training_step.json: "
            + "; ".join(differences)
            + " - the resume uses train_config.json's values",
        )
    return Check.ok("config-vs-record", "train_config.json agrees with training_step.json")


def _precision(source: ResumeSource, target: ResumeTarget) -> Check:
    saved, now = source.record.mixed_precision, target.mixed_precision
    if saved is not None and now is not None and saved != now:
        return Check.warn(
            "precision",
            f"mixed precision {saved} → {now}: weights and optimizer state are fp32 masters and load as they are,"
            " but the numerics of the continued run change",
        )
    return Check.ok("precision", f"mixed precision {now or saved or 'unknown'} (unchanged)")


def _pretrained(source: ResumeSource) -> list[Check]:
    """``--policy.path`` is loaded again on resume (the PEFT base, or a fine-tune's starting point).

    A PEFT run without one is a start-up refusal (:mod:`ckpt_tools.format.rules.startup`).
    """
    out = []
    path = source.config.policy_path if source.config else None
    name = "peft-base" if source.peft else "pretrained-policy"
    if path:
        out.append(_policy_dir(name, path, "train_config.json policy.path", "the resume rebuilds the model from"))
    if source.peft:
        out.append(_adapter_config(source))
    return out


def _policy_dir(name: str, path: str, what: str, role: str) -> Check:
    """Whether the trainer will find the weights where ``path`` points (resolved as it resolves --policy.path)."""
    try:
        located = locate_policy(path)
    except CkptError as e:
        return Check.fail(name, f"{what} {e} - it holds the weights {role}")
    if not isinstance(located, Path):
        return Check.ok(name, f"{what} {path}: a Hub id, resolved through the Hugging Face cache at start-up")
    refusal = adapter_refusal(path, located)
    if refusal is not None:  # the trainer's own line: it loads full weights only
        return Check.fail(name, f"{what}: {refusal}")
    if policy_weights(located) is not None:
        return Check.ok(name, f"{what} {path}: the weights {role}")
    return Check.fail(name, f"{what} {path}: no {L.MODEL_WEIGHTS} there, the weights {role}")


def _adapter_config(source: ResumeSource) -> Check:
    from ckpt_tools.io.safe_read import read_json

    path = source.paths.adapter_config
    try:
        base = read_json(path).get("base_model_name_or_path")
    except FileNotFoundError:
        return Check.warn("adapter-config", f"{path}: missing - the adapter cannot be loaded with PeftModel")
    except (OSError, ValueError, AttributeError) as e:
        return Check.warn("adapter-config", f"{path}: unreadable ({e})")
    if not base:
        return Check.warn(
            "adapter-config",
            "adapter_config.json records no base_model_name_or_path: --policy.path=<this checkpoint> cannot find"
            " the base model (the resume itself uses train_config.json's policy.path)",
        )
    check = _policy_dir(
        "adapter-config", str(base), "adapter_config.json base_model_name_or_path", "PeftModel loads the adapter onto"
    )
    # The resume itself does not read it (train_config.json's policy.path does that job): a warning.
    return Check.warn(check.name, check.message) if check.status == "fail" else check


def _dataset(source: ResumeSource) -> Check:
    config = source.config
    root = config.dataset_root if config else None
    recorded = source.record.sampler.dataset_size if source.record.sampler else None
    if not root:
        repo = config.dataset_repo_id if config else None
        where = f"--dataset.repo_id={repo}" if repo else "no dataset recorded"
        return Check.ok("dataset", f"{where}: resolved through the Hugging Face cache at start-up (not checked here)")
    frames = Path(root).expanduser() / dataset.FRAMES_FILE
    if not Path(root).expanduser().is_dir():
        return Check.fail("dataset", f"--dataset.root={root}: no such directory - the resume cannot load its data")
    try:
        header = read_header(frames)
    except CkptError as e:
        return Check.fail("dataset", f"--dataset.root={root}: {e}")
    column = header.entries.get(dataset.LENGTH_COLUMN)
    size = column.shape[0] if column is not None and column.shape else None
    if recorded is not None and size is not None and size != recorded:
        return Check.warn(
            "dataset",
            f"--dataset.root={root} has {size} samples, the checkpoint's sampler {recorded}:"
            " the saved position points into a different sample order",
        )
    return Check.ok("dataset", f"--dataset.root={root} ({size if size is not None else '?'} samples)")


def _lerobot_dataset(source: ResumeSource) -> Check:
    """A LeRobot dataset root (``meta/info.json``), or a Hub id resolved at start-up."""
    config = source.config
    root = config.dataset_root if config else None
    if not root:
        repo = config.dataset_repo_id if config else None
        where = f"--dataset.repo_id={repo}" if repo else "no dataset recorded"
        return Check.ok(
            "dataset",
            f"{where}: resolved through the Hugging Face cache at start-up (not checked here: neither its files nor"
            " whether its features fit the policy)",
        )
    if not Path(root).expanduser().is_dir():
        return Check.fail("dataset", f"--dataset.root={root}: no such directory - the resume cannot load its data")
    info = _lerobot_info(root)
    if info is None:  # LeRobotDatasetMetadata reads it first thing: the resume stops there
        return Check.fail(
            "dataset",
            f"--dataset.root={root}: no readable {dataset.INFO_FILE} with total_frames - LeRobot cannot load the"
            " dataset without it",
        )
    problems = _lerobot_feature_problems(source, info)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return Check.fail("dataset", f"--dataset.root={root} does not fit the policy: {problems[0]}{more}")
    return Check.ok("dataset", f"--dataset.root={root} ({info['total_frames']} frames; its features fit the policy)")


def _lerobot_info(root: str) -> dict[str, Any] | None:
    """The dataset's ``meta/info.json`` when LeRobot can load it (an object with ``total_frames``), else None."""
    from ckpt_tools.io.safe_read import read_json_file

    try:
        info = read_json_file(Path(root).expanduser() / dataset.INFO_FILE, want_object=True)
    except CkptError:
        return None
    frames = info.get("total_frames")
    return info if isinstance(frames, int) and not isinstance(frames, bool) and frames > 0 else None


def _lerobot_feature_problems(source: ResumeSource, info: dict[str, Any]) -> list[str]:
    """:func:`~ckpt_tools.format.rules.lerobot_features.feature_problems` for the saved policy and ``info``.

    The resume parses the policy from ``train_config.json`` (``config.json`` holds the same section).
    """
    from ckpt_tools.io.safe_read import read_json_file

    raw = source.config.raw if source.config else {}
    policy = raw.get("policy")
    if not isinstance(policy, dict) or "input_features" not in policy:
        try:
            policy = read_json_file(source.paths.policy_config, want_object=True)
        except CkptError:
            return []  # no policy to compare with: the policy checks say so
    features = info.get("features")
    if not isinstance(features, dict):
        return [f"{dataset.INFO_FILE} has no features object - LeRobotDatasetMetadata cannot type the dataset"]
    rename_map = raw.get("rename_map")
    return feature_problems(policy, features, rename_map if isinstance(rename_map, dict) else None)


def lerobot_frames(source: ResumeSource) -> int | None:
    """The frames LeRobot's sampler draws from: ``meta/info.json`` ``total_frames`` of the dataset root.

    None when unknown, or when the run used part of the episodes or a policy that drops last
    frames (``drop_n_last_frames``): the sampler's length is then not the dataset's.
    """
    from ckpt_tools.io.safe_read import read_json_file

    config = source.config
    root = config.dataset_root if config else None
    if not root or config is None:
        return None
    if config.raw.get("dataset", {}).get("episodes") or config.raw.get("policy", {}).get("drop_n_last_frames"):
        return None
    try:
        info = read_json_file(Path(root).expanduser() / dataset.INFO_FILE, want_object=True)
    except CkptError:
        return None
    frames = info.get("total_frames")
    return frames if isinstance(frames, int) and not isinstance(frames, bool) and frames > 0 else None


def _data_order(source: ResumeSource, target: ResumeTarget) -> Check:
    record = source.record
    position = ""
    frames = lerobot_frames(source) if target.trainer is Trainer.LEROBOT else None
    if frames is not None and record.batch_size and record.dp_world_size:
        state = sampler_state(record.step, frames, record.batch_size, record.dp_world_size)
        if state is not None:
            position = (
                f"; LeRobot's sampler resumes at epoch {state.epoch}, sample {state.start_index} of {frames}"
                " (compute_sampler_state)"
            )
    if record.sampler is not None:
        position = f"; the sampler resumes at epoch {record.sampler.epoch}, offset {record.sampler.offset}"
    now_world = target.topology.dp_world_size if target.topology else target.world_size
    change = DataOrderChange(record.dp_world_size, record.batch_size, now_world, target.batch_size)
    check = Check.ok if change.sample_exact else Check.warn
    return check("data-order", f"{change.describe()}{position}")


def _effective_batch(source: ResumeSource, target: ResumeTarget) -> Check:
    before = source.record.batch
    world = target.topology.dp_world_size if target.topology else target.world_size
    if before is None or target.batch_size is None or target.grad_accum_steps is None:
        return Check.warn("effective-batch", "unknown: the record or the target lacks batch_size / grad_accum")
    after = BatchFactorization(target.batch_size, world, target.grad_accum_steps)
    if after.effective_batch_size == before.effective_batch_size:
        return Check.ok("effective-batch", f"effective batch {after.effective_batch_size} (unchanged)")
    config = source.config
    scaling = linear_scaling(
        before, after, lr=config.lr if config else None, steps=config.steps if config else None, step=source.record.step
    )
    suggested = scaling.describe()
    return Check.warn(
        "effective-batch",
        f"effective batch {before.effective_batch_size} → {after.effective_batch_size}"
        f" ({target.batch_size} × {world} × {target.grad_accum_steps})"
        + (f"; {suggested}; never applied automatically" if suggested else ""),
    )
