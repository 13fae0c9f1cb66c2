"""``inspect_path``: which reader a path takes, by the kind :func:`ckpt_tools.format.layout.locate` finds."""

from __future__ import annotations

import contextlib
import os

from ckpt_tools.check import Check
from ckpt_tools.errors import CheckpointError, UsageError
from ckpt_tools.facts import save_data
from ckpt_tools.format import layout as L
from ckpt_tools.inspect.dcp import inspect_dcp
from ckpt_tools.inspect.records import verify_below
from ckpt_tools.inspect.report import InspectReport, set_subject
from ckpt_tools.inspect.roots import inspect_root, inspect_trainer_root, retention
from ckpt_tools.inspect.safetensors import inspect_safetensors, inspect_safetensors_dir
from ckpt_tools.inspect.steps import inspect_loose_dir, inspect_step
from ckpt_tools.io.remote import remote_file


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
        inspect_root(located.path, report, tensors)
        retention(located.path, report, keep_last)
    elif kind is L.PathKind.TRAINER_ROOT:
        inspect_trainer_root(located.path, report, tensors)
    elif kind is L.PathKind.STEP_DIR:
        inspect_step(L.StepPaths(located.path), report, tensors)
    elif kind in (L.PathKind.PRETRAINED_MODEL, L.PathKind.TRAINING_STATE):
        if located.step is not None:
            inspect_step(located.step, report, tensors, only=kind)
        else:
            inspect_loose_dir(located.path, report, tensors)
    elif kind is L.PathKind.DCP_DIR:
        inspect_dcp(located.path, located.path.name, report, tensors)
    elif kind is L.PathKind.SAFETENSORS_DIR:
        inspect_safetensors_dir(located.path, report, tensors)
    else:
        inspect_safetensors(located.path, located.path.name, report, tensors)
    if report.checkpoint is None and kind not in (L.PathKind.CHECKPOINTS_ROOT, L.PathKind.TRAINER_ROOT):
        # A DCP dir or a file inside a step dir: the step verify-resume would read (none: in no step dir).
        with contextlib.suppress(CheckpointError):
            set_subject(report, L.resolve_step(located.path).root, None)
    if verify_data and kind in (L.PathKind.DCP_DIR, L.PathKind.SAFETENSORS_DIR, L.PathKind.SAFETENSORS_FILE):
        verify_below(located.path, report)
    elif verify_data and kind is L.PathKind.TRAINER_ROOT:
        report.checks.append(Check.warn("data digests", save_data.NO_RECORD))
    return report
