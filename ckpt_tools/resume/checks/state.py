"""Checks on the files a resume reads: present, complete, and covering the model.

Each check follows one step of the training core's load (ckpt_tools/train/checkpoint/load.py):
the 0.6.x refusal and ``samples_seen`` (``check_resumable``), the weights and optimizer inputs
the manifest chooses, the scheduler state it always reads, the RNG states it reads only when
the world size is unchanged, and the loss-scaler state an fp16 run needs (the manifest's
``Resume`` rule, shared with the loader). Whether the weights are the copy training holds
(bit-exactness, :func:`~ckpt_tools.format.rules.master_copy_problem`) is a warning: the
loader casts them back and resumes, but not exactly.

When the trainer is LeRobot's (a checkpoint LeRobot wrote), each check follows LeRobot main's
resume instead (``src/lerobot/common/train_utils.py`` ``resume_before_prepare`` /
``resume_after_prepare``, :mod:`ckpt_tools.format.lerobot`): weights from the DCP shards its
config's ``checkpoint_format`` names, the optimizer state keyed by position in its bare list of
param groups, one RNG state every rank loads, the scheduler state only when the run has a
scheduler, no loss-scaler state.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ckpt_tools.check import Check
from ckpt_tools.errors import CkptError
from ckpt_tools.facts import consistency as counters_of
from ckpt_tools.facts import save_files as files_against_record
from ckpt_tools.facts import saved_hyperparameters
from ckpt_tools.facts.resumable import unresumable_reason
from ckpt_tools.format import ema as ema_rules
from ckpt_tools.format import lerobot, manifest
from ckpt_tools.format.param_groups import metadata_scalars, position_names, read_param_groups
from ckpt_tools.format.peft_keys import saved_adapter_key
from ckpt_tools.format.rules import consistency, lerobot_resume, master_copy_problem, save_files
from ckpt_tools.format.rules.resumable import Trainer
from ckpt_tools.format.rules.resume_output import check_output
from ckpt_tools.format.rules.startup import RunSettings
from ckpt_tools.io.remote import remote_file
from ckpt_tools.io.safe_read import read_json_file
from ckpt_tools.resume.source import Container, ResumeSource, SavedTensor
from ckpt_tools.resume.target import ResumeTarget
from ckpt_tools.st.header import SafetensorsHeader, read_header

ADAM_SLOTS = ("exp_avg", "exp_avg_sq", "step")


def state_checks(source: ResumeSource, target: ResumeTarget, *, build: bool = False) -> list[Check]:
    record, paths = source.record, source.paths
    trainer = _trainer(source, target)
    reason = unresumable_reason(paths, record, has_optimizer=source.optimizer is not None, trainer=target.trainer)
    if reason is not None:
        return [trainer, Check.fail("layout", reason)]
    seen = f"{record.samples_seen} samples seen"
    if "samples_seen" in record.derived:
        seen += " (step × batch_size × dp_world_size: LeRobot's rule, it records no data position)"
    elif record.samples_seen is None:
        seen = "no batch_size / world size recorded: LeRobot places the sampler with the resumed run's own"
    checks = [
        trainer,
        Check.ok("layout", f"resumable layout, saved on {record.topology.describe() if record.topology else '?'}"),
        Check.ok("training-step", f"step {record.step}, {seen}"),
    ]
    if source.config is None:
        checks.append(Check.fail("train-config", source.config_error or f"{paths.train_config}: missing"))
    else:
        checks.append(Check.ok("train-config", f"{_rel(source, paths.train_config)} (the resume starts from it)"))
    checks += _weights(source, target)
    checks += _optimizer(source, target)
    if source.weights is not None and source.optimizer is not None:
        checks.append(_weights_precision(source))
    checks.append(_scheduler(source, target))
    checks.append(_rng(source, target))
    checks.append(_scaler(source, target))
    checks.append(_consistency(source))
    if not _lerobot(target) and target.settings is not None:
        checks.append(_saved_settings(source, target.settings))
        checks.append(_ema(source, target.settings))
    checks.append(_save_files(source, target))
    edit = save_files.config_edit(source.paths)
    if edit is not None:
        checks.append(Check.warn("config-edits", edit))
    for check in (_config_builds(source, target), _output(source, target)):
        if check is not None:
            checks.append(check)
    if build and not any(c.failed for c in checks):  # the trainer's next step, only past every file check
        checks += [c for c in _build_checks(source, target) if not _said_by_dataset_check(c, source)]
    return checks


def _said_by_dataset_check(check: Check, source: ResumeSource) -> bool:
    """A dataset directory that does not exist: the ``dataset`` check names it already (one line, not two)."""
    root = source.config.dataset_root if source.config is not None else None
    return check.name == "dataset-loads" and check.failed and root is not None and not Path(root).expanduser().is_dir()


def _config_builds(source: ResumeSource, target: ResumeTarget) -> Check | None:
    """The trainer's own parse and validation of ``train_config.json`` (torch-free; it needs the
    training extra's config parser, and says so where that is not installed)."""
    if _lerobot(target) or source.config is None:
        return None
    if importlib.util.find_spec("draccus") is None:
        return Check.ok(
            "config-builds",
            "not checked here: the trainer's config parser comes with the training extra (ckpt-tools[training])",
        )
    from ckpt_tools.train.parsing import resume_config

    try:
        resume_config(source.paths, []).validate()
    except CkptError as e:
        return Check.fail("config-builds", str(e))
    return Check.ok("config-builds", "ckpt-train parses and validates train_config.json")


def _build_checks(source: ResumeSource, target: ResumeTarget) -> list[Check]:
    """The trainer's own build before its first step - dataset, policy on the meta device, the weights
    against it (:func:`ckpt_tools.train.preflight.build_checks`); only where torch is installed."""
    if _lerobot(target) or source.config is None or target.topology is None:
        return []  # LeRobot builds its own policy; a refused topology stops before any build
    if remote_file(source.paths.root) is not None:
        return [
            Check.ok(
                "policy-builds",
                "not run: the checkpoint is on the Hub, and the build (dataset, policy, load plan) reads its files"
                " locally; ckpt-train --checkpoint.resume_from=hf://... downloads them and runs it",
            )
        ]
    if not (_importable("torch") and _importable("draccus")):
        return [
            Check.ok(
                "policy-builds",
                "not run here: building the policy (and the dataset-loads and load-plan checks) needs the"
                " training extra (ckpt-tools[training])",
            )
        ]
    from ckpt_tools.train.parsing import resume_config
    from ckpt_tools.train.preflight import Launch, build_checks

    try:
        cfg = resume_config(source.paths, [])
    except CkptError:
        return []  # config-builds said why
    launch = Launch(target.world_size, target.world_size, on_host=True, check_memory=False)
    return [c for c in build_checks(cfg, source.paths.root, launch) if c.name != "world"]


def _importable(name: str) -> bool:
    """Whether ``name`` could be imported here (an environment that blocks it counts as without)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _output(source: ResumeSource, target: ResumeTarget) -> Check | None:
    """The trainer's refusal to resume an older step over the newer checkpoints of its output dir."""
    if _lerobot(target) or target.output_dir is None:
        return None
    verdict = check_output(source.paths, source.record.step, target.output_dir, overwrite=target.overwrite_checkpoints)
    if verdict.refusal is not None:
        return Check.fail("output", verdict.refusal)
    return Check.ok("output", "; ".join(verdict.notices) or f"writes into {target.output_dir} (its own run)")


def _saved_settings(source: ResumeSource, settings: RunSettings) -> Check:
    """The saved optimizer / scheduler values against the resumed config (the trainer's refusal)."""
    line = saved_hyperparameters.mismatch(source.paths, settings)
    if line is not None:
        return Check.fail("hyperparameters", line)
    return Check.ok("hyperparameters", "the saved optimizer and scheduler settings are the config's")


def _ema(source: ResumeSource, settings: RunSettings) -> Check:
    """The EMA state against the resumed ``--ema.enable`` (the trainer's refusal, :func:`ckpt_tools.format.ema.resume_refusal`)."""
    line = ema_rules.resume_refusal(source.paths, source.record, settings.ema_enable)
    if line is not None:
        return Check.fail("ema", line)
    if ema_rules.checkpoint_has_ema(source.paths, source.record):
        return Check.ok("ema", f"EMA shadow after {source.record.ema_steps} updates, continued (--ema.enable=true)")
    return Check.ok("ema", "no EMA state, none kept (--ema.enable=false)")


def _trainer(source: ResumeSource, target: ResumeTarget) -> Check:
    """Which trainer's resume the checks predict, and why."""
    record = source.record
    if source.trainer is Trainer.LEROBOT:
        era = "0.6.x" if record.is_legacy else "main"
        written = f"LeRobot wrote this checkpoint ({era} record, LeRobot policy)"
    else:
        written = "ckpt-train wrote this checkpoint"
    if target.trainer is Trainer.LEROBOT:
        return Check.ok(
            "trainer",
            f"{written}: predicting {target.trainer.command} by LeRobot main's rules"
            " (ckpt-train does not resume LeRobot checkpoints; --trainer ckpt-train says why)",
        )
    return Check.ok("trainer", f"{written}: predicting {target.trainer.command}")


def _lerobot(target: ResumeTarget) -> bool:
    return target.trainer is Trainer.LEROBOT


def _scheduler(source: ResumeSource, target: ResumeTarget) -> Check:
    path = source.paths.scheduler_state
    if _lerobot(target) and not _resume(source, target).scheduler:
        return Check.ok(
            "scheduler", "the run has no LR scheduler (train_config.json scheduler: null): nothing to restore"
        )
    return _json_file("scheduler", path, "LR scheduler state, always restored")


def _consistency(source: ResumeSource) -> Check:
    """The trainer's refusal of a checkpoint whose parts are not from one step (record, directory, Adam, scheduler)."""
    counters = counters_of.read_counters(source.paths, source.record)
    found = consistency.problems(counters)
    if found:
        return Check.fail("consistency", consistency.summary(found))
    return Check.ok("consistency", consistency.describe(counters))


def _save_files(source: ResumeSource, target: ResumeTarget) -> Check:
    """The trainer's refusal of a step holding files its save did not write (LeRobot's resume does not look)."""
    try:
        saved = save_files.read(source.paths)
    except CkptError as e:
        return Check.fail("save-files", str(e))
    found = files_against_record.problems(source.paths, saved) if saved is not None else []
    if not found:
        edited = save_files.edits(source.paths, saved) if saved is not None else []
        note = f"; edited since the save (the resume uses the edits): {', '.join(edited)}" if edited else ""
        return Check.ok("save-files", save_files.describe(saved, source.paths) + note)
    line = save_files.summary(source.paths, found)
    if _lerobot(target):  # it loads them: the run goes on, not from the state that was saved
        return Check.warn("save-files", f"{line}; lerobot-train does not check and would resume from a mixed state")
    return Check.fail("save-files", line)


# ---------------------------------------------------------------------- weights


def _weights(source: ResumeSource, target: ResumeTarget) -> list[Check]:
    paths = source.paths
    if source.weights is None:
        return [Check.fail("weights", source.weights_error or "no weights")]
    weights = source.weights
    where = _rel(source, weights.path)
    if weights.problems:
        return [Check.fail("weights", f"{where}: {_first(weights.problems)}")]
    if _lerobot(target):
        fmt = source.config.checkpoint_format if source.config else None
        missing = lerobot_resume.missing_weights(paths, target.checkpoint_format or fmt)
        if missing is not None:
            return [Check.fail("weights", missing)]
    n = target.world_size
    onto = target.topology.describe() if target.topology else f"{n} process{'es' if n != 1 else ''}"
    if weights.index is not None:
        table = weights.index.table
        files = len(set(table.file[table.file >= 0].tolist()))
        out = [
            Check.ok(
                "weights",
                f"{where} (DCP: {len(table.names)} tensors in {files} shard files) reshards onto {onto}",
            )
        ]
    else:
        out = [
            Check.ok("weights", f"{where} ({len(source.params)} tensors, read whole by every rank) loads onto {onto}")
        ]
        if paths.model_dcp.is_dir():
            out.append(
                Check.warn(
                    "weights-dcp",
                    f"{_rel(source, paths.model_dcp)}/ has no .metadata (a save that did not complete):"
                    f" the resume ignores it and loads {weights.path.name}",
                )
            )
    out.append(_weights_coverage(source))
    return out


def _weights_coverage(source: ResumeSource) -> Check:
    """DCP weights are loaded strictly: every key of the model must be there, at its shape."""
    paths = source.paths
    gathered = paths.root / manifest.gathered_weights(source.peft).path
    if source.weights is None or source.weights.index is None or not gathered.exists():
        return Check.ok("weights-coverage", f"{len(source.params)} tensors; no second copy to compare with")
    try:
        header = read_header(gathered)
    except CkptError as e:
        return Check.warn("weights-coverage", f"cannot compare with {gathered.name}: {e}")
    dcp = {saved_adapter_key(k) if source.peft else k: v for k, v in source.params.items()}
    missing = sorted(k for k in header.entries if k not in dcp)
    if missing:
        return Check.fail(
            "weights-coverage",
            f"{_rel(source, source.weights.path)} misses {len(missing)} of the {len(header.entries)} tensors of"
            f" {gathered.name} (e.g. {missing[0]}): the strict DCP load will fail",
        )
    wrong = [k for k, e in header.entries.items() if dcp[k].shape != e.shape]
    if wrong:
        k = wrong[0]
        return Check.fail(
            "weights-coverage",
            f"{k}: {list(dcp[k].shape)} in the DCP shards, {list(header.entries[k].shape)} in {gathered.name}",
        )
    return Check.ok("weights-coverage", f"DCP shards hold every tensor of {gathered.name} at its shape")


# ---------------------------------------------------------------------- optimizer


def _optimizer(source: ResumeSource, target: ResumeTarget | None = None) -> list[Check]:
    if source.optimizer is None:
        return [Check.fail("optimizer", source.optimizer_error or "no optimizer state")]
    optimizer = source.optimizer
    where = _rel(source, optimizer.path)
    if optimizer.problems:
        return [Check.fail("optimizer", f"{where}: {_first(optimizer.problems)}")]
    kind = "DCP" if optimizer.index is not None else "safetensors + param groups JSON"
    keyed = ", by position in the optimizer" if source.positional else ""
    out = [Check.ok("optimizer", f"{where} ({kind}: state of {len(source.optimizer_state)} parameters{keyed})")]
    if optimizer.header is not None:
        groups = _flat_groups(source, optimizer, lerobot_form=target is not None and _lerobot(target))
        if groups is not None:
            out.append(groups)
            return out
    out.append(_positional_coverage(source) if source.positional else _optimizer_coverage(source))
    return out


def _flat_groups(source: ResumeSource, optimizer: Container, *, lerobot_form: bool = False) -> Check | None:
    """``optimizer_param_groups.json`` names every parameter that has state (the loader splits keys by it)."""
    path = source.paths.optimizer_param_groups
    header = optimizer.header
    try:
        by_position = position_names(header.metadata, header.path) if header is not None else None
        scalars = metadata_scalars(header.metadata, header.path) if header is not None else None
        names = set(read_param_groups(path, names=by_position, scalars=scalars, lerobot_form=lerobot_form).names)
    except CkptError as e:
        return Check.fail("optimizer-coverage", str(e))  # the line the trainer's load stops with
    unknown = sorted(n for n in source.optimizer_state if n not in names)
    if unknown:
        key = next(iter(source.optimizer_state[unknown[0]].values())).key
        return Check.fail(
            "optimizer-coverage",
            f"{_rel(source, optimizer.path)} holds {key!r}, state of a parameter {path.name} does not list",
        )
    return None


def _optimizer_coverage(source: ResumeSource) -> Check:
    """Every trainable parameter has Adam state at its shape (the DCP load is strict)."""
    if source.weights is None:
        return Check.warn("optimizer-coverage", "not checked: no weights to compare with")
    by_param = {}
    for name, slots in source.optimizer_state.items():
        param = source.param_of(name)
        if param is not None:
            by_param[param.name] = slots
    missing = sorted(p for p in source.trainable if p not in by_param)
    if missing:
        return Check.fail(
            "optimizer-coverage",
            f"no optimizer state for {len(missing)} of {len(source.trainable)} trainable parameters"
            f" (e.g. {missing[0]}): the strict load will fail",
        )
    for name, slots in sorted(by_param.items()):
        bad = _slot_problem(source.params[name], slots)
        if bad:
            return Check.fail("optimizer-coverage", f"{name}: {bad}")
    return Check.ok("optimizer-coverage", f"Adam state for all {len(source.trainable)} trainable parameters")


def _positional_coverage(source: ResumeSource) -> Check:
    """LeRobot's state keyed by position: complete slots, each moment shaped like some tensor of the weights.

    Positions cannot be matched to names from the files (LeRobot's optimizer lists parameters in
    the policy's registration order, which no file records); torch's ``load_state_dict`` pairs
    them by position in the groups, so what can be checked is the state itself.
    """
    shapes = {spec.shape for spec in source.params.values()}
    for position, slots in sorted(source.optimizer_state.items(), key=lambda item: int(item[0])):
        absent = [s for s in ADAM_SLOTS if s not in slots]
        if absent:
            return Check.fail(
                "optimizer-coverage", f"optimizer state of parameter {position} lacks {', '.join(absent)}"
            )
        moment = slots["exp_avg"]
        if moment.shape not in shapes:
            return Check.fail(
                "optimizer-coverage",
                f"optimizer state of parameter {position}: exp_avg is {list(moment.shape)}, no tensor of the weights is",
            )
    return Check.ok(
        "optimizer-coverage",
        f"Adam state of {len(source.optimizer_state)} parameters, by position (each shaped like a tensor of the"
        f" weights; {len(source.params)} tensors there, buffers included)",
    )


def _weights_precision(source: ResumeSource) -> Check:
    """The weights are the copy training holds: every parameter in the dtype of its Adam moments.

    AdamW keeps ``exp_avg`` in the parameter's dtype, so the optimizer state records the master
    dtype even after the DCP shards are gone (``convert-dcp --dtype bf16 --delete-dcp``).
    """
    master = {}
    for name, slots in source.optimizer_state.items():
        param = source.param_of(name)
        moment = slots.get("exp_avg") or slots.get("exp_avg_sq")
        if param is not None and moment is not None:
            master[param.name] = moment.dtype
    assert source.weights is not None
    if source.positional:
        dtypes = sorted({slots["exp_avg"].dtype for slots in source.optimizer_state.values() if "exp_avg" in slots})
        weights = sorted({t.dtype for t in source.params.values()})
        if dtypes and weights != dtypes:
            return Check.warn(
                "weights-precision",
                f"{_rel(source, source.weights.path)}: the weights are {', '.join(weights)}, the optimizer state"
                f" {', '.join(dtypes)}: a resume casts them and does not continue bit-exactly",
            )
        return Check.ok("weights-precision", f"weights and optimizer state are {', '.join(weights) or '?'}")
    problem = master_copy_problem({n: t.dtype for n, t in source.params.items()}, master)
    if problem is not None:
        return Check.warn("weights-precision", f"{_rel(source, source.weights.path)}: {problem}")
    return Check.ok("weights-precision", f"{len(master)} parameters held in their optimizer state's dtype")


def _slot_problem(param: SavedTensor, slots: dict[str, SavedTensor]) -> str | None:
    absent = [s for s in ADAM_SLOTS if s not in slots]
    if absent:
        return f"optimizer state lacks {', '.join(absent)}"
    for slot in ("exp_avg", "exp_avg_sq"):
        if slots[slot].shape != param.shape:
            return f"{slot} is {list(slots[slot].shape)}, the parameter {list(param.shape)}"
    return None


# ---------------------------------------------------------------------- sidecars


def _rng(source: ResumeSource, target: ResumeTarget) -> Check:
    saved = source.record.topology.world_size if source.record.topology else None
    path = source.paths.rng_state
    if _lerobot(target):
        return _lerobot_rng(source, target)
    if not _resume(source, target).same_world:
        return Check.ok(
            "rng-state",
            f"not read: world size {saved} → {target.world_size}, generators reseed from (seed, step, rank)",
        )
    if not path.exists():
        return Check.fail(
            "rng-state",
            f"{_rel(source, path)}: missing - an unchanged world size ({saved}) restores every rank's generator from it",
        )
    header = _rng_header(path)
    if isinstance(header, Check):
        return header
    absent = [r for r in range(target.world_size) if f"rank{r}.torch" not in header.entries]
    if absent:
        return Check.fail("rng-state", f"{_rel(source, path)}: no generator state for rank {absent[0]}")
    return Check.ok("rng-state", f"generator state of all {target.world_size} ranks (restored: same world size)")


def _rng_header(path: Path) -> SafetensorsHeader | Check:
    """The header of ``rng_state.safetensors``, or the failed check saying why it cannot be read."""
    try:
        header = read_header(path)
    except CkptError as e:
        return Check.fail("rng-state", str(e))
    if header.problems:
        return Check.fail("rng-state", _first(list(header.problems)))
    return header


def _lerobot_rng(source: ResumeSource, target: ResumeTarget) -> Check:
    """LeRobot saves the main process's generators once; every rank loads them, whatever the world size."""
    path = source.paths.rng_state
    if not path.exists():
        return Check.fail("rng-state", f"{_rel(source, path)}: missing - LeRobot's resume loads it on every rank")
    header = _rng_header(path)
    if isinstance(header, Check):
        return header
    absent = [k for k in lerobot.RNG_KEYS if k not in header.entries]
    if absent:
        return Check.fail("rng-state", f"{_rel(source, path)}: no {absent[0]} (LeRobot's resume reads it)")
    return Check.ok(
        "rng-state",
        f"the main process's Python, NumPy and torch generators, loaded by each of the {target.world_size} ranks",
    )


def _scaler(source: ResumeSource, target: ResumeTarget) -> Check:
    path = source.paths.scaler_state
    if _lerobot(target):
        return Check.ok("scaler", "LeRobot saves no loss-scaler state (accelerate's scaler starts afresh)")
    if not _resume(source, target).fp16:
        return Check.ok("scaler", f"not needed (mixed precision {target.mixed_precision or 'no'})")
    if not path.exists():
        saved = source.record.mixed_precision
        why = "" if saved == "fp16" else f" (the checkpoint was saved with mixed precision {saved})"
        return Check.fail(
            "scaler",
            f"{_rel(source, path)}: missing; mixed precision fp16 needs the saved loss-scaler state{why}",
        )
    return _json_file("scaler", path, "fp16 loss-scaler state")


def _json_file(name: str, path: Path, what: str) -> Check:
    """The loader reads this file with :func:`read_json_file` and hands the object to ``load_state_dict``."""
    try:
        read_json_file(path, missing=f"missing ({what})", want_object=True)
    except CkptError as e:
        return Check.fail(name, str(e))
    return Check.ok(name, f"{path.parent.name}/{path.name} ({what})")


def _first(problems: list[str]) -> str:
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more


def _rel(source: ResumeSource, path: Path) -> str:
    try:
        return str(path.relative_to(source.paths.root))
    except ValueError:
        return str(path)


def _resume(source: ResumeSource, target: ResumeTarget) -> manifest.Resume:
    return manifest.Resume.at(source.paths, source.record, target.world_size, target.mixed_precision)
