"""``inspect_path``: what a checkpoint path holds and whether it is healthy - from headers only.

Works on a checkpoints root, a step dir, ``pretrained_model/``, ``training_state/``, a DCP
dir (rank-local metadata and torch's zstd extension included), a single ``.safetensors`` file or
a folder of them (``convert-dcp --max-shard-size`` output, torch's HF storage writer: its
distributed pieces are shown as pieces of the tensors they belong to, never as whole tensors). It reads ``training_step.json``, DCP ``.metadata``,
the few hundred header bytes of each chunk archive and each safetensors header - never
tensor data - so it takes the same fraction of a second on any model size.

Health checks (:class:`ckpt_tools.check.Check`) pass, or have one of two severities: ``fail``
(the checkpoint is broken: a file the layout requires is missing, metadata is inconsistent,
chunks do not tile a tensor, a file is truncated) and ``warn`` (worth knowing, still loadable:
a crashed partial save, an unreferenced shard file, the 0.6.x layout that cannot resume, a
*leftover* - the hidden temporary file of a killed write or the moved-aside directory of an
interrupted ``convert-dcp --delete-dcp``, named as :mod:`ckpt_tools.io.fsutil` names them).
``healthy`` is true when no check failed.

``check_values=True`` (``inspect --check-values``) also reads every tensor's data, a block at a
time (:mod:`ckpt_tools.values`), and fails a ``<file> values`` check for each weights or
optimizer container holding NaN or infinite values, listing them in ``nonfinite``.

``verify_data=True`` (``inspect --verify-data``) also reads every byte of every file the step's
save recorded against the full digests it computed as it wrote them
(:mod:`ckpt_tools.format.rules.save_data`): a ``data digests`` check, failed by any byte that
differs (a bit flipped in the middle of a shard, which the save-files check's 4 KiB ends do
not see), with the speed it read at. A step without such a record gets a ``warn``: no
per-byte verification is possible; the checkpoint is not called unhealthy for it.

``InspectReport.to_dict`` (what ``inspect --json`` prints) holds every field of the report
plus ``healthy``; each check is ``{"name", "status", "message"}``, the shape ``verify-resume``
and ``reshard-plan`` use too.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_tools import ema_inspect
from ckpt_tools.check import Check, Subject
from ckpt_tools.dcp import hf_storage, validate
from ckpt_tools.dcp.index import ChunkIndex, RankShard
from ckpt_tools.errors import CheckpointError, CkptError, UsageError
from ckpt_tools.format import layout as L
from ckpt_tools.format import manifest
from ckpt_tools.format.record import TrainingStep
from ckpt_tools.format.rules import load_parts, save_data, save_files, unresumable_reason
from ckpt_tools.format.rules.resumable import Trainer, checkpoint_trainer
from ckpt_tools.io.fsutil import find_leftovers
from ckpt_tools.io.remote import remote_file
from ckpt_tools.st import dtypes
from ckpt_tools.st.header import SafetensorsHeader, read_header
from ckpt_tools.st.index import read_index
from ckpt_tools.values import NonFinite, ValueScan, scan_dcp, scan_safetensors


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[dict[str, Any], ...] = ()  # DCP only: offsets, sizes, file


@dataclass(frozen=True)
class WeightsSummary:
    """One weights container: a safetensors file (or index) or a DCP directory."""

    path: str
    format: str  # "safetensors" or "dcp"
    tensors: int
    parameters: int
    bytes: int
    bytes_by_dtype: dict[str, int]
    parameters_by_dtype: dict[str, int]
    ranks: tuple[RankShard, ...] = ()
    top_level_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepSummary:
    name: str
    step: int | None
    healthy: bool
    failed_checks: int


@dataclass
class RetentionView:
    """What retention of the newest ``keep_last_n`` would do to a checkpoints root (nothing is removed)."""

    keep_last_n: int
    source: str  # "--keep-last", or the train_config.json the run's --checkpoint.keep_last_n came from
    removes: list[str] = field(default_factory=list)
    keeps: dict[str, list[str]] = field(default_factory=dict)  # step name -> why it stays


@dataclass
class InspectReport:
    path: str
    kind: str
    checks: list[Check] = field(default_factory=list)
    checkpoint: str | None = None  # the step dir read, absolute, `last` followed (check.Subject)
    step: int | None = None
    formats: list[str] = field(default_factory=list)
    peft: bool | None = None
    processors: list[str] = field(default_factory=list)
    training_step: dict[str, Any] | None = None
    topology: str | None = None
    batch: str | None = None
    initialized_from: str | None = None  # a run started from another's parts (--checkpoint.load_from)
    legacy: bool = False
    weights: list[WeightsSummary] = field(default_factory=list)
    steps: list[StepSummary] = field(default_factory=list)
    last: str | None = None
    partial_saves: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)  # interrupted writes and deletions, relative paths
    inspected_step: str | None = None
    tensors: list[TensorInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    values_checked: bool = False  # every tensor's data was read (check_values)
    data_checked: bool = False  # every recorded byte was to be read (verify_data)
    data_verified: bool = False  # every recorded byte was read against the save's full digests (verify_data)
    data_bytes: int = 0  # bytes read for it
    data_gb_per_s: float | None = None  # the speed it read and digested them at
    nonfinite: list[NonFinite] = field(default_factory=list)  # tensors holding NaN or inf (values_checked)
    retention: RetentionView | None = None  # what --keep-last / the run's keep_last_n would remove (a root)
    ema: dict[str, Any] | None = None  # the step's EMA weights (ckpt_tools.ema_inspect); None: it has none

    @property
    def healthy(self) -> bool:
        return not any(c.failed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["healthy"] = self.healthy
        for w in out["weights"]:
            for r in w["ranks"]:
                r["files"] = list(r["files"])
        return out


# ====================================================================== entry point


def inspect_path(
    path: str | os.PathLike[str],
    *,
    tensors: bool = False,
    check_values: bool = False,
    verify_data: bool = False,
    keep_last: int | None = None,
) -> InspectReport:
    """Inspect ``path``; raises :class:`CheckpointError` only when it is not a checkpoint at all.

    ``check_values`` reads every tensor's data too (of every step, on a checkpoints root);
    ``verify_data`` every recorded byte against the save's full digests (likewise).
    ``keep_last``: on a checkpoints root, what retention of the newest N would remove (without
    it, the run's own ``--checkpoint.keep_last_n``, when its ``train_config.json`` has one).
    """
    located = L.locate(path)
    if (check_values or verify_data) and remote_file(located.path) is not None:
        flag = "--check-values" if check_values else "--verify-data"
        raise UsageError(
            f"{located.path}: {flag} reads every byte of the checkpoint, which ranged reads from the Hub are not for;"
            " download it first (hf download) and inspect the local copy"
        )
    report = InspectReport(
        path=str(located.path), kind=located.kind.value, values_checked=check_values, data_checked=verify_data
    )
    kind = located.kind
    if kind is L.PathKind.CHECKPOINTS_ROOT:
        _inspect_root(located.path, report, tensors)
        _retention(located.path, report, keep_last)
    elif kind is L.PathKind.TRAINER_ROOT:
        _inspect_trainer_root(located.path, report, tensors)
    elif kind is L.PathKind.STEP_DIR:
        _inspect_step(L.StepPaths(located.path), report, tensors)
    elif kind in (L.PathKind.PRETRAINED_MODEL, L.PathKind.TRAINING_STATE):
        if located.step is not None:
            _inspect_step(located.step, report, tensors, only=kind)
        else:
            _inspect_loose_dir(located.path, report, tensors)
    elif kind is L.PathKind.DCP_DIR:
        _inspect_dcp(located.path, located.path.name, report, tensors)
    elif kind is L.PathKind.SAFETENSORS_DIR:
        _inspect_safetensors_dir(located.path, report, tensors)
    else:
        _inspect_safetensors(located.path, located.path.name, report, tensors)
    if report.checkpoint is None and kind not in (L.PathKind.CHECKPOINTS_ROOT, L.PathKind.TRAINER_ROOT):
        # A DCP dir or a file inside a step dir: the step verify-resume would read (none: in no step dir).
        with contextlib.suppress(CheckpointError):
            _subject(report, L.resolve_step(located.path).root, None)
    if verify_data and kind in (L.PathKind.DCP_DIR, L.PathKind.SAFETENSORS_DIR, L.PathKind.SAFETENSORS_FILE):
        _verify_below(located.path, report)
    elif verify_data and kind is L.PathKind.TRAINER_ROOT:
        report.checks.append(Check.warn("data digests", save_data.NO_RECORD))
    return report


def _verify_below(path: Path, report: InspectReport) -> None:
    """``--verify-data`` on a DCP dir or a file: the recorded files under it, when it lies in a step dir."""
    try:
        step = L.resolve_step(path)
        under = path.resolve().relative_to(step.root.resolve()).as_posix()
    except (CheckpointError, ValueError):
        report.checks.append(Check.warn("data digests", save_data.NO_RECORD))
        return
    _verify_data(step, report, under)


def _verify_data(paths: L.StepPaths, report: InspectReport, under: str | None) -> None:
    """The ``data digests`` check: every recorded byte (under ``under``) against the save's full digests."""
    try:
        saved = save_files.read(paths)
    except CheckpointError:
        return  # the save-files check reports the unreadable record
    if saved is None:
        report.checks.append(Check.warn("data digests", save_data.NO_RECORD))
        return
    verdict = save_data.verify(paths, saved, under)
    report.data_bytes += verdict.bytes
    report.data_gb_per_s = round(verdict.gb_per_s, 3)
    if verdict.problems:
        report.checks.append(Check.fail("data digests", verdict.summary(paths)))
        return
    if verdict.unverifiable and not verdict.files:
        report.checks.append(
            Check.warn(
                "data digests",
                f"the record of save {saved.save_id[:12]} holds no digest of every byte (an older, schema-1 record):"
                " no per-byte verification is possible",
            )
        )
        return
    report.data_verified = not verdict.unverifiable
    line = verdict.summary(paths)
    if verdict.unverifiable:
        report.checks.append(
            Check.warn(
                "data digests", f"{line}; {len(verdict.unverifiable)} recorded without a full digest, not verified"
            )
        )
    else:
        report.checks.append(Check.ok("data digests", line))


def _subject(report: InspectReport, step_dir: Path, record: TrainingStep | None) -> None:
    """``checkpoint``, ``step`` and ``topology`` as ``verify-resume`` reports them (:class:`Subject`)."""
    subject = Subject.of(step_dir, record)
    report.checkpoint, report.step, report.topology = subject.checkpoint, subject.step, subject.topology


# ====================================================================== checkpoints root


def _inspect_root(root: Path, report: InspectReport, tensors: bool) -> None:
    steps = L.list_step_dirs(root)
    link = root / L.LAST_LINK
    try:
        last = L.resolve_last(root)
        hostile = None
    except CheckpointError as e:  # a pointer file holding anything but a step dir's name
        last, hostile = None, str(e)
    report.partial_saves = [p.name for p in L.list_partial_dirs(root)]
    for name in report.partial_saves:
        report.checks.append(Check.warn("partial save", f"{name}: left by a save that did not complete"))
    _leftovers(root, [root], report)
    if hostile is not None:
        report.checks.append(Check.fail("last link", hostile))
    elif link.is_symlink() or link.exists():
        ok = last is not None and last.parent.resolve() == root.resolve() and L.is_step_dir_name(last.name)
        pointer = L.last_is_pointer_file(root)
        report.last = (
            last.name
            if last is not None
            else os.readlink(link)
            if link.is_symlink()
            else L.read_last_pointer(link)
            if pointer
            else None
        )
        kind = " (pointer file)" if pointer else ""
        report.checks.append(
            Check.judge(
                "last link",
                ok,
                f"last -> {report.last}{kind}" if ok else f"last -> {report.last}{kind}: not a step dir here",
            )
        )
    elif steps and remote_file(root) is not None:
        shown = last.name if last is not None else None
        report.checks.append(
            Check.ok("last link", f"on the Hub, where an upload leaves 'last' out: the newest, {shown}")
        )
    elif steps:
        report.checks.append(Check.fail("last link", "no 'last' link next to the step dirs"))
    if not steps:
        report.checks.append(Check.fail("steps", f"{root}: no complete step directory"))
        return
    target = last if last is not None and last in [s.resolve() for s in steps] else steps[-1]
    for step_dir in steps:
        sub = InspectReport(
            path=str(step_dir),
            kind=L.PathKind.STEP_DIR.value,
            values_checked=report.values_checked,
            data_checked=report.data_checked,
        )
        _inspect_step(L.StepPaths(step_dir), sub, tensors and step_dir.resolve() == target.resolve())
        report.data_bytes += sub.data_bytes
        failed = sum(c.failed for c in sub.checks)
        report.steps.append(StepSummary(step_dir.name, L.StepPaths(step_dir).step, sub.healthy, failed))
        if step_dir.resolve() == target.resolve():
            _adopt(report, sub)
        elif failed:
            report.checks.append(Check.fail(f"step {step_dir.name}", f"{failed} failed checks (inspect it)"))
    report.inspected_step = target.name


def _retention(root: Path, report: InspectReport, keep_last: int | None) -> None:
    """What retention would remove from ``root``, by the rule the trainer and ``prune`` apply."""
    from ckpt_tools.format.train_config import read_saved_config
    from ckpt_tools.retention import read_run_steps

    try:
        facts = read_run_steps(root)
    except CheckpointError:
        return  # a hostile `last`: its check already fails, and nothing could be removed
    source = "--keep-last"
    if keep_last is None and facts.last is not None:
        with contextlib.suppress(CkptError):
            config = read_saved_config(L.StepPaths(facts.steps[facts.last]).train_config)
            keep_last, source = (
                config.keep_last_n,
                f"{facts.steps[facts.last].name}/{L.PRETRAINED_MODEL_DIR}/{L.TRAIN_CONFIG}",
            )
    if keep_last is None or keep_last < 1:
        return
    plan = facts.plan(keep_last)
    report.retention = RetentionView(
        keep_last,
        source,
        [facts.steps[n].name for n in plan.removed],
        {facts.steps[f.step].name: list(f.reasons) for f in plan.kept},
    )


def _inspect_trainer_root(root: Path, report: InspectReport, tensors: bool) -> None:
    """Another trainer's folder of ``step-N/`` saves (torchtitan's): every save checked, the newest in detail."""
    steps = L.list_trainer_steps(root)
    report.partial_saves = [p.name for p in L.incomplete_trainer_steps(root)]
    for name in report.partial_saves:
        report.checks.append(Check.warn("partial save", f"{name}: no .metadata - a save that did not complete"))
    if not steps:
        report.checks.append(Check.fail("steps", f"{root}: no complete step-N save"))
        return
    newest = steps[-1]
    for step_dir in steps:
        sub = InspectReport(path=str(step_dir), kind=L.PathKind.DCP_DIR.value, values_checked=report.values_checked)
        if (step_dir / L.DCP_METADATA).is_file():
            _inspect_dcp(step_dir, step_dir.name, sub, tensors and step_dir == newest)
        else:  # a Hugging Face last step: model.safetensors.index.json and its shards
            _inspect_index(step_dir / L.MODEL_WEIGHTS_INDEX, f"{step_dir.name}/{L.MODEL_WEIGHTS_INDEX}", sub, tensors)
        failed = sum(c.failed for c in sub.checks)
        report.steps.append(StepSummary(step_dir.name, L.trainer_step_number(step_dir), sub.healthy, failed))
        if step_dir == newest:
            report.checks.extend(sub.checks)
            report.weights, report.tensors, report.notes = sub.weights, sub.tensors, sub.notes
            report.nonfinite = sub.nonfinite
        elif failed:
            report.checks.append(Check.fail(f"step {step_dir.name}", f"{failed} failed checks (inspect it)"))
    report.inspected_step = newest.name


def _adopt(report: InspectReport, sub: InspectReport) -> None:
    """Take the inspected step's details into the root report (checks prefixed with its name)."""
    name = Path(sub.path).name
    report.checks.extend(Check(f"{name}: {c.name}", c.status, c.message) for c in sub.checks)
    for attr in (
        "checkpoint",
        "step",
        "formats",
        "peft",
        "processors",
        "training_step",
        "topology",
        "batch",
        "legacy",
        "data_verified",
        "data_gb_per_s",
        "ema",
    ):
        setattr(report, attr, getattr(sub, attr))
    report.weights, report.tensors, report.notes = sub.weights, sub.tensors, sub.notes
    report.leftovers += [f"{name}/{rel}" for rel in sub.leftovers]
    report.nonfinite = sub.nonfinite


# ====================================================================== one step


def _inspect_step(paths: L.StepPaths, report: InspectReport, tensors: bool, only: L.PathKind | None = None) -> None:
    record = _training_step(paths, report)
    _subject(report, paths.root, record)
    pm = paths.pretrained_model
    peft = manifest.is_peft(pm, record=record)
    report.peft = peft
    report.processors = [p.name for p in paths.processor_files()]
    report.formats = _formats(paths)
    part = {L.PathKind.PRETRAINED_MODEL: L.PRETRAINED_MODEL_DIR, L.PathKind.TRAINING_STATE: L.TRAINING_STATE_DIR}
    variant = manifest.Variant.at(paths, record, peft) if record is not None else None
    report.checks.extend(_expected_files(paths, variant, part.get(only) if only else None))
    _leftovers(paths.root, [paths.root, pm, paths.training_state], report)
    _save_files(paths, report, part.get(only) if only else None)
    if report.data_checked:
        _verify_data(paths, report, part.get(only) if only else None)
    for f in _weight_files(pm):
        _inspect_safetensors(f, _rel(paths.root, f), report, tensors and not paths.model_dcp.is_dir())
    if paths.model_dcp.is_dir():
        _inspect_dcp(paths.model_dcp, _rel(paths.root, paths.model_dcp), report, tensors, record=record)
    if only is not L.PathKind.PRETRAINED_MODEL:
        if paths.optimizer_dcp.is_dir():
            _inspect_dcp(paths.optimizer_dcp, _rel(paths.root, paths.optimizer_dcp), report, False, record=record)
        for f in sorted(paths.training_state.glob("*.safetensors")):
            _header_check(f, _rel(paths.root, f), report)
    for f in sorted(pm.glob(f"{L.PREPROCESSOR}*.safetensors")) + sorted(pm.glob(f"{L.POSTPROCESSOR}*.safetensors")):
        _header_check(f, _rel(paths.root, f), report)
    if only is None and ema_inspect.has_ema(paths):
        report.ema, check = ema_inspect.inspect_ema(paths, record)
        report.checks.append(check)


def _save_files(paths: L.StepPaths, report: InspectReport, part: str | None) -> None:
    """Are the step's files the ones its save wrote (the rule the resume refuses by)? ``part``: only those under it."""
    try:
        saved = save_files.read(paths)
    except CheckpointError as e:
        report.checks.append(Check.fail("save files", str(e)))
        return
    if saved is None:
        report.notes.append(save_files.describe(None))
        return
    found = [f for f in save_files.problems(paths, saved) if part is None or f.startswith(part + "/")]
    if found:
        report.checks.append(Check.fail("save files", save_files.summary(paths, found)))
        return
    edited = save_files.edits(paths, saved)
    note = f"; edited since the save: {', '.join(edited)}" if edited else ""
    report.checks.append(Check.ok("save files", save_files.describe(saved, paths) + note))


def _training_step(paths: L.StepPaths, report: InspectReport) -> TrainingStep | None:
    try:
        record = manifest.read_record(paths)  # LeRobot records: completed from what the files say
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


def _leftovers(base: Path, directories: list[Path], report: InspectReport) -> None:
    """Name what killed writes and interrupted deletions left in ``directories`` (a warning each)."""
    for directory in directories:
        for leftover in find_leftovers(directory):
            rel = _rel(base, leftover.path)
            report.leftovers.append(rel)
            report.checks.append(Check.warn("leftover", f"{rel}: {leftover.describe()}"))


def _weight_files(pm: Path) -> list[Path]:
    index = pm / L.MODEL_WEIGHTS_INDEX
    files = []
    for name in (L.MODEL_WEIGHTS, L.ADAPTER_WEIGHTS):
        if (pm / name).is_file():
            files.append(pm / name)
    if index.is_file():
        files.append(index)
    return files


def _inspect_loose_dir(path: Path, report: InspectReport, tensors: bool) -> None:
    """A ``pretrained_model/`` (or ``training_state/``) outside any step dir: weights only."""
    _leftovers(path, [path], report)
    for f in _weight_files(path):
        _inspect_safetensors(f, f.name, report, tensors)
    dcp = path / L.MODEL_DCP_DIR
    if dcp.is_dir():
        _inspect_dcp(dcp, dcp.name, report, tensors)
    if not report.weights and not report.checks:
        report.checks.append(Check.fail("weights", f"{path}: no weights found"))


# ====================================================================== safetensors


def _inspect_safetensors(path: Path, rel: str, report: InspectReport, tensors: bool) -> None:
    if path.name.endswith(".index.json"):
        _inspect_index(path, rel, report, tensors)
        return
    header = _header_check(path, rel, report)
    if header is None:
        return
    if hf_storage.SHARDING_INFO_KEY in header.metadata and _inspect_piece_file(header, rel, report, tensors):
        return
    report.weights.append(_summary_from_header(rel, [header]))
    if tensors:
        report.tensors.extend(_tensors_from_header(header))


def _header_check(path: Path, rel: str, report: InspectReport) -> SafetensorsHeader | None:
    try:
        header = read_header(path)
    except CkptError as e:
        report.checks.append(Check.fail(rel, str(e)))
        return None
    if header.problems:
        report.checks.append(Check.fail(rel, "; ".join(header.problems[:3])))
    else:
        report.checks.append(Check.ok(rel, f"header sane, {len(header.entries)} tensors, {header.file_size} bytes"))
        if report.values_checked:
            _values_check(rel, report, lambda: scan_safetensors(header, rel))
    return header


def _values_check(rel: str, report: InspectReport, scan: Callable[[], ValueScan]) -> None:
    """Read one container's tensor data: a ``<rel> values`` check, failed by any NaN or infinity."""
    name = f"{rel} values"
    try:
        found = scan()
    except CkptError as e:
        report.checks.append(Check.fail(name, str(e)))
        return
    except OSError as e:  # a read error mid-file (the headers were readable)
        report.checks.append(Check.fail(name, f"{e.filename or rel}: unreadable ({e.strerror or e})"))
        return
    report.nonfinite.extend(found.nonfinite)
    if not found.nonfinite:
        what = f"{found.tensors} floating-point tensors, {found.values} values" if found.tensors else "no float tensors"
        report.checks.append(Check.ok(name, f"{what}: all finite" if found.tensors else what))
        return
    shown = ", ".join(n.describe() for n in found.nonfinite[:3])
    more = f" and {len(found.nonfinite) - 3} more" if len(found.nonfinite) > 3 else ""
    report.checks.append(
        Check.fail(
            name,
            f"{len(found.nonfinite)} of {found.tensors} floating-point tensors hold NaN or infinite values:"
            f" {shown}{more}",
        )
    )


def _inspect_index(path: Path, rel: str, report: InspectReport, tensors: bool) -> None:
    try:
        weight_map = read_index(path)
    except CkptError as e:
        report.checks.append(Check.fail(rel, str(e)))
        return
    files = sorted(set(weight_map.values()))
    headers = []
    for name in files:
        header = _header_check(path.parent / name, str(Path(rel).parent / name), report)
        if header is not None:
            headers.append(header)
            missing = [k for k, f in weight_map.items() if f == name and k not in header.entries]
            if missing:
                report.checks.append(Check.fail(rel, f"{name} lacks {missing[0]} (and {len(missing) - 1} more)"))
    report.weights.append(_summary_from_header(rel, headers))
    if tensors:
        for h in headers:
            report.tensors.extend(_tensors_from_header(h))


def _summary_from_header(rel: str, headers: list[SafetensorsHeader]) -> WeightsSummary:
    by_dtype: Counter[str] = Counter()
    params: Counter[str] = Counter()
    count = 0
    for header in headers:
        for e in header.entries.values():
            known = dtypes.BY_SAFETENSORS.get(e.dtype)
            name = known.name if known else e.dtype
            by_dtype[name] += e.nbytes
            params[name] += e.numel // (known.packed if known else 1)
            count += 1
    return WeightsSummary(
        path=rel,
        format="safetensors",
        tensors=count,
        parameters=sum(params.values()),
        bytes=sum(by_dtype.values()),
        bytes_by_dtype=dict(by_dtype),
        parameters_by_dtype=dict(params),
    )


def _tensors_from_header(header: SafetensorsHeader) -> list[TensorInfo]:
    out = []
    for e in header.entries.values():
        dtype = dtypes.BY_SAFETENSORS.get(e.dtype)
        shape = (dtype.torch_shape(e.shape) if dtype else None) or e.shape  # F4: torch's float4_e2m1fn_x2 shape
        out.append(TensorInfo(e.name, dtype.name if dtype else e.dtype, shape))
    return out


# ====================================================================== folders of safetensors, HF-storage pieces


def _inspect_safetensors_dir(path: Path, report: InspectReport, tensors: bool) -> None:
    """A folder of safetensors: whole tensors (with or without an index), or torch's HF-storage pieces."""
    _leftovers(path, [path], report)
    try:
        store = hf_storage.load(path)
    except CkptError as e:
        report.checks.append(Check.fail(path.name, str(e)))
        return
    if store.needs_merge:
        _inspect_pieces(store, report, tensors)
    else:
        indexed: set[str] = set()
        for index in sorted(path.glob(f"*{L.SAFETENSORS_INDEX_SUFFIX}")):
            with contextlib.suppress(CkptError):
                indexed |= set(read_index(index).values())
            _inspect_index(index, index.name, report, tensors)
        for f in hf_storage.safetensors_files(path):
            if f.name not in indexed:
                _inspect_safetensors(f, f.name, report, tensors)
    sharded = path / hf_storage.SHARDED_DIR
    if sharded.is_dir() and hf_storage.safetensors_files(sharded):
        report.notes.append(
            f"{hf_storage.SHARDED_DIR}/ holds torch's HF-storage pieces (enable_consolidation keeps them): inspect it"
            " to check them"
        )
    if not report.weights and not any(c.failed for c in report.checks):
        report.checks.append(Check.fail("weights", f"{path}: no weights found"))


def _inspect_pieces(store: hf_storage.HfStorage, report: InspectReport, tensors: bool) -> None:
    """torch's distributed HF-storage save: each file's header, then whether the pieces tile every tensor."""
    for header in store.headers:
        _header_check(header.path, header.path.name, report)
    index = store.to_index()
    found = [validate.Problem(m) for m in store.problems] + validate.structure_problems(index)
    count = sum(len(p) for p in store.pieces.values())
    report.checks.append(
        Check.judge(
            "pieces",
            not found,
            validate.summary(found)
            if found
            else f"{count} pieces in {len(store.headers)} files tile all {len(store.pieces)} tensors exactly",
        )
    )
    report.weights.append(
        WeightsSummary(path=store.root.name, format="safetensors pieces (torch HF storage)", **_totals(index))
    )
    report.notes.append(
        f"torch's HF storage writer with save_distributed: {len(index.tensors)} tensors saved in {count} pieces;"
        f" `convert-dcp {store.root} --output DIR` merges them into whole tensors"
    )
    if tensors:
        for entry in index.tensors.values():
            chunks = tuple({"offsets": list(c.offsets), "sizes": list(c.sizes), "file": c.file} for c in entry.chunks)
            report.tensors.append(TensorInfo(entry.fqn, entry.dtype, entry.shape, chunks))


def _inspect_piece_file(header: SafetensorsHeader, rel: str, report: InspectReport, tensors: bool) -> bool:
    """One file of torch's HF-storage save: report its tensors as pieces when the folder says they are.

    False when every tensor of the folder is whole (rank 0's full save): the file is then read
    as any safetensors file.
    """
    try:
        store = hf_storage.load(header.path.parent)
    except CkptError:
        store = None
    if store is None or not store.needs_merge:
        return False
    mine = [p for pieces in store.pieces.values() for p in pieces if p.file == header.path.name]
    partial = [p for p in mine if len(store.pieces[p.name]) > 1 or p.shape != store.size(p.name)]
    summary = _summary_from_header(rel, [header])
    report.weights.append(replace(summary, format="safetensors pieces (torch HF storage)"))
    if partial:
        p = partial[0]
        report.checks.append(
            Check.warn(
                f"{rel} pieces",
                f"{len(partial)} of its {len(mine)} tensors are pieces of larger ones (torch's HF storage,"
                f" save_distributed), e.g. {p.name} {list(p.shape)} at offset {list(p.offsets)} of"
                f" {list(store.size(p.name))}: inspect {header.path.parent}/ or merge it with convert-dcp",
            )
        )
    if tensors:
        for p in mine:
            name = dtypes.BY_SAFETENSORS[p.dtype].name
            chunk = {"offsets": list(p.offsets), "sizes": list(p.shape), "file": p.file}
            report.tensors.append(TensorInfo(p.name, name, store.size(p.name), (chunk,)))
    return True


# ====================================================================== DCP


def _inspect_dcp(
    directory: Path, rel: str, report: InspectReport, tensors: bool, *, record: TrainingStep | None = None
) -> None:
    try:
        index = ChunkIndex.load(directory)
    except CkptError as e:
        report.checks.append(Check.fail(f"{rel}/.metadata", str(e)))
        return
    rank_local = index.table.rank_local
    read = f"rank-local metadata, the union of {', '.join(rank_local)} (no .metadata): " if rank_local else ""
    report.checks.append(
        Check.ok(
            f"{rel}/.metadata",
            f"{read}{len(index.table.names)} tensors in {index.table.rows} chunks, {len(index.byte_items)} other items",
        )
    )
    source = {"index": "the save's index (.metadata.index)", "cache": "the cache of an earlier look"}
    if index.origin.source in source:
        report.notes.append(f"{rel}: chunk table read from {source[index.origin.source]}")
    if index.origin.note:
        report.checks.append(Check.warn(f"{rel}/{L.DCP_INDEX}", index.origin.note))
    problems = validate.structure_problems(index)
    if problems and all(p.needs for p in problems):  # readable with a package installed: not the checkpoint's fault
        report.checks.append(Check.warn(f"{rel} chunks", validate.summary(problems)))
    else:
        report.checks.append(
            Check.judge(
                f"{rel} chunks",
                not problems,
                validate.summary(problems)
                if problems
                else "every chunk inside its file; chunks tile every tensor exactly",
            )
        )
    if (index.table.byte_items and any(b.transforms for b in index.table.byte_items)) or np.any(
        index.table.transform[index.table.file >= 0] != 0
    ):
        report.notes.append(f"{rel}: chunks are zstd-compressed (torch's ZStandard extension)")
    unrepresentable = Counter(
        e.dtype for e in index.tensors.values() if not (d := dtypes.BY_NAME.get(e.dtype)) or not d.representable
    )
    if unrepresentable:
        kinds = ", ".join(f"{n} {dtype}" for dtype, n in sorted(unrepresentable.items()))
        report.notes.append(f"{rel}: {kinds} tensors have no safetensors dtype; convert-dcp skips them")
    if not problems:
        archives = _archive_check(index, rel, report.notes)
        report.checks.append(archives)
        if report.values_checked and not archives.failed:
            _values_check(rel, report, lambda: scan_dcp(index, rel))
    unreferenced = index.unreferenced_files()
    if unreferenced:
        names = ", ".join(unreferenced[:5]) + (f" and {len(unreferenced) - 5} more" if len(unreferenced) > 5 else "")
        report.checks.append(Check.warn(f"{rel} files", f"not referenced by .metadata: {names}"))
    ranks = tuple(index.ranks())
    if record is not None and record.topology is not None and ranks:
        expected = record.topology.world_size
        got = max(r.rank for r in ranks) + 1
        report.checks.append(
            Check.judge(
                f"{rel} ranks",
                got == expected,
                f"shards from {got} ranks, training_step.json says world_size {expected}",
            )
        )
    report.weights.append(
        WeightsSummary(
            path=rel,
            format="dcp",
            **_totals(index),
            ranks=ranks,
            top_level_keys=tuple(sorted(str(k) for k in index.top_level_keys())),
        )
    )
    if tensors:
        for entry in index.tensors.values():
            chunks = tuple({"offsets": list(c.offsets), "sizes": list(c.sizes), "file": c.file} for c in entry.chunks)
            report.tensors.append(TensorInfo(entry.fqn, entry.dtype, entry.shape, chunks))


def _archive_check(index: ChunkIndex, rel: str, notes: list[str]) -> Check:
    """Each chunk's archive holds what ``.metadata`` promises; each non-tensor item is plain data.

    While every shard file is as it was when its archives were known sound - written by the
    save that indexed them, or checked by an earlier look - they are not read again (a note
    says so; ``--no-cache`` reads them all).
    """
    if remote_file(index.root) is not None:
        return Check.ok(
            f"{rel} chunk data",
            "not read: the shards stay on the Hub (the sizes its listing gives hold every chunk); convert-dcp reads them",
        )
    if index.archives_known_good():
        how = "as the save wrote them" if index.origin.source == "index" else "as an earlier look checked them"
        notes.append(f"{rel}: chunk archives {how}: every shard file's size and time unchanged since, not re-read")
    found = validate.archive_problems(index)
    if found:
        return Check.fail(f"{rel} chunk data", validate.summary(found))
    chunks = index.chunk_count
    items = f" and {len(index.byte_items)} non-tensor items are plain data" if index.byte_items else ""
    return Check.ok(f"{rel} chunk data", f"{chunks} chunk archives hold the dtype and shape .metadata says{items}")


def _rel(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _totals(index: ChunkIndex) -> dict[str, Any]:
    """Tensor, parameter and byte counts of a chunk index, in all and by dtype (a WeightsSummary's numbers)."""
    by_dtype: Counter[str] = Counter()
    params: Counter[str] = Counter()
    for e in index.tensors.values():
        params[e.dtype] += e.numel
        if e.nbytes is not None:  # a dtype of unknown width counts its parameters only
            by_dtype[e.dtype] += e.nbytes
    return {
        "tensors": len(index.tensors),
        "parameters": sum(params.values()),
        "bytes": sum(by_dtype.values()),
        "bytes_by_dtype": dict(by_dtype),
        "parameters_by_dtype": dict(params),
    }
