"""One step dir as ``inspect`` reports it: ``training_step.json``, the files the layout requires
for the recorded variant, the save's record of its files, every weights and optimizer
container, the processors, the EMA weights; and a ``pretrained_model/`` outside any step dir.
"""

from __future__ import annotations

from pathlib import Path

from ckpt_tools.check import Check
from ckpt_tools.errors import CheckpointError
from ckpt_tools.facts.record import read_record
from ckpt_tools.facts.resumable import unresumable_reason
from ckpt_tools.format import layout as L
from ckpt_tools.format import manifest
from ckpt_tools.format.record import TrainingStep
from ckpt_tools.format.rules import load_parts
from ckpt_tools.format.rules.resumable import Trainer, checkpoint_trainer
from ckpt_tools.inspect import ema
from ckpt_tools.inspect.checks import header_check, leftovers, relative
from ckpt_tools.inspect.dcp import inspect_dcp
from ckpt_tools.inspect.records import data_digests_check, save_files_check
from ckpt_tools.inspect.report import InspectReport, set_subject
from ckpt_tools.inspect.safetensors import inspect_safetensors

PART_DIRS = {L.PathKind.PRETRAINED_MODEL: L.PRETRAINED_MODEL_DIR, L.PathKind.TRAINING_STATE: L.TRAINING_STATE_DIR}


def inspect_step(paths: L.StepPaths, report: InspectReport, tensors: bool, only: L.PathKind | None = None) -> None:
    """Every check of a step dir; ``only``: of its ``pretrained_model/`` or ``training_state/`` alone."""
    record = _training_step(paths, report)
    set_subject(report, paths.root, record)
    pm = paths.pretrained_model
    peft = manifest.is_peft(pm, record=record)
    report.peft = peft
    report.processors = [p.name for p in paths.processor_files()]
    report.formats = _formats(paths)
    part = PART_DIRS.get(only) if only else None
    variant = manifest.Variant.at(paths, record, peft) if record is not None else None
    report.checks.extend(_expected_files(paths, variant, part))
    leftovers(paths.root, [paths.root, pm, paths.training_state], report)
    save_files_check(paths, report, part)
    if report.data_checked:
        data_digests_check(paths, report, part)
    for f in weight_files(pm):
        inspect_safetensors(f, relative(paths.root, f), report, tensors and not paths.model_dcp.is_dir())
    if paths.model_dcp.is_dir():
        inspect_dcp(paths.model_dcp, relative(paths.root, paths.model_dcp), report, tensors, record=record)
    if only is not L.PathKind.PRETRAINED_MODEL:
        if paths.optimizer_dcp.is_dir():
            inspect_dcp(paths.optimizer_dcp, relative(paths.root, paths.optimizer_dcp), report, False, record=record)
        for f in sorted(paths.training_state.glob("*.safetensors")):
            header_check(f, relative(paths.root, f), report)
    for f in sorted(pm.glob(f"{L.PREPROCESSOR}*.safetensors")) + sorted(pm.glob(f"{L.POSTPROCESSOR}*.safetensors")):
        header_check(f, relative(paths.root, f), report)
    if only is None and ema.has_ema(paths):
        report.ema, check = ema.inspect_ema(paths, record)
        report.checks.append(check)


def _training_step(paths: L.StepPaths, report: InspectReport) -> TrainingStep | None:
    """The step's record, completed from its files for LeRobot's; its facts and notes into ``report``."""
    try:
        record = read_record(paths)  # LeRobot records: completed from what the files say
    except CheckpointError as e:
        report.checks.append(Check.fail("training_step.json", str(e)))
        return None
    report.training_step = record.to_dict()
    report.legacy = record.is_legacy
    if record.batch is not None:
        report.batch = record.batch.describe()
    if record.initialized_from is not None:
        report.initialized_from = load_parts.describe(record.initialized_from)
    summary = record.unknown_summary()
    if summary and not record.is_legacy:
        report.notes.append(summary)
    derived = record.describe_derived()
    if derived:
        report.notes.append(derived)
    trainer = checkpoint_trainer(paths, record)
    if trainer is Trainer.LEROBOT:
        report.notes.append(
            f"written by LeRobot ({'0.6.x' if record.is_legacy else 'main'} record): verify-resume predicts LeRobot's"
            " resume (lerobot-train --resume=true); ckpt-train does not resume it (its policies are not LeRobot's)"
        )
    has_optimizer = manifest.choose(manifest.optimizer_inputs(), paths) is not None
    refusal = unresumable_reason(paths, record, has_optimizer=has_optimizer, trainer=trainer)
    if record.is_legacy and refusal:  # the line verify-resume and the trainer refuse it with; its weights are fine
        report.checks.append(Check.warn("resumable layout", refusal))
    report.checks.append(Check.ok("training_step.json", f"step {record.step}"))
    return record


def _formats(paths: L.StepPaths) -> list[str]:
    pm, out = paths.pretrained_model, []
    if (pm / L.MODEL_WEIGHTS).exists() or (pm / L.MODEL_WEIGHTS_INDEX).exists():
        out.append("safetensors")
    if (pm / L.ADAPTER_WEIGHTS).exists():
        out.append("safetensors (adapter)")
    if paths.model_dcp.is_dir():
        out.append("dcp")
    if paths.optimizer_dcp.is_dir():
        out.append("dcp optimizer")
    elif paths.optimizer_state.exists():
        out.append("safetensors optimizer")
    return out


def _expected_files(paths: L.StepPaths, variant: manifest.Variant | None, part: str | None) -> list[Check]:
    """Check the files the manifest requires for ``variant`` (docs/checkpoint-format.md); ``part`` limits it
    to one of the two directories."""
    missing, notes = [], []
    gathered = manifest.gathered_weights(variant.peft if variant is not None else False)
    converted = [paths.root / f for f in (gathered.path, *gathered.stand_ins) if (paths.root / f).exists()]
    for wanted in manifest.required_parts(variant):
        for rel in wanted.required_files():
            if part is not None and not rel.startswith(part + "/"):
                continue
            path = paths.root / rel
            if rel == wanted.path and any((paths.root / s).exists() for s in wanted.stand_ins):
                continue  # a sharded gathered save: the index stands for model.safetensors
            if path.is_file():
                continue
            if path.exists():  # a directory, FIFO or device where a file belongs
                missing.append(f"{rel} (not a regular file)")
                continue
            if wanted is manifest.MODEL_DCP and converted:
                # convert-dcp --delete-dcp replaced the shards by the gathered file: still loadable.
                notes.append(Check.warn("weights converted", f"{wanted.name} replaced by {converted[0].name}"))
                continue
            missing.append(f"{rel} ({wanted.what})")
    if missing:
        return [Check.fail("expected files", "missing: " + "; ".join(missing)), *notes]
    where = f" in {part}/" if part else ""
    return [Check.ok("expected files", f"every file this run's checkpoint must hold is present{where}"), *notes]


def weight_files(pm: Path) -> list[Path]:
    """The gathered weights of a ``pretrained_model/``: model and adapter files, the shards' index."""
    index = pm / L.MODEL_WEIGHTS_INDEX
    files = []
    for name in (L.MODEL_WEIGHTS, L.ADAPTER_WEIGHTS):
        if (pm / name).is_file():
            files.append(pm / name)
    if index.is_file():
        files.append(index)
    return files


def inspect_loose_dir(path: Path, report: InspectReport, tensors: bool) -> None:
    """A ``pretrained_model/`` (or ``training_state/``) outside any step dir: weights only."""
    leftovers(path, [path], report)
    for f in weight_files(path):
        inspect_safetensors(f, f.name, report, tensors)
    dcp = path / L.MODEL_DCP_DIR
    if dcp.is_dir():
        inspect_dcp(dcp, dcp.name, report, tensors)
    if not report.weights and not report.checks:
        report.checks.append(Check.fail("weights", f"{path}: no weights found"))
