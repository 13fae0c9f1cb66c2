"""The checks against the record a ckpt-train save keeps of its files: ``save files`` (are these
the files that save wrote? the rule the resume refuses by) and, with ``--verify-data``,
``data digests``: every byte the save recorded read against the full digests it computed as it
wrote them (:mod:`ckpt_tools.facts.save_data`) - failed by any byte that differs (a bit
flipped in the middle of a shard, which the save-files check's 4 KiB ends do not see), with
the speed it read at. A step without such a record gets a ``warn``: no per-byte verification
is possible; the checkpoint is not called unhealthy for it.
"""

from __future__ import annotations

from pathlib import Path

from ckpt_tools.check import Check
from ckpt_tools.errors import CheckpointError
from ckpt_tools.facts import save_data
from ckpt_tools.facts import save_files as files_against_record
from ckpt_tools.format import layout as L
from ckpt_tools.format.rules import save_files
from ckpt_tools.inspect.report import InspectReport


def save_files_check(paths: L.StepPaths, report: InspectReport, part: str | None) -> None:
    """Are the step's files the ones its save wrote (the rule the resume refuses by)? ``part``: only those under it."""
    try:
        saved = save_files.read(paths)
    except CheckpointError as e:
        report.checks.append(Check.fail("save files", str(e)))
        return
    if saved is None:
        report.notes.append(save_files.describe(None))
        return
    found = [f for f in files_against_record.problems(paths, saved) if part is None or f.startswith(part + "/")]
    if found:
        report.checks.append(Check.fail("save files", save_files.summary(paths, found)))
        return
    edited = save_files.edits(paths, saved)
    note = f"; edited since the save: {', '.join(edited)}" if edited else ""
    report.checks.append(Check.ok("save files", save_files.describe(saved, paths) + note))


def verify_below(path: Path, report: InspectReport) -> None:
    """``--verify-data`` on a DCP dir or a file: the recorded files under it, when it lies in a step dir."""
    try:
        step = L.resolve_step(path)
        under = path.resolve().relative_to(step.root.resolve()).as_posix()
    except (CheckpointError, ValueError):
        report.checks.append(Check.warn("data digests", save_data.NO_RECORD))
        return
    data_digests_check(step, report, under)


def data_digests_check(paths: L.StepPaths, report: InspectReport, under: str | None) -> None:
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
