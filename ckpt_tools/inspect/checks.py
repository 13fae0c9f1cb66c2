"""The checks every kind of container shares: a safetensors header, the values of a container's
tensors (``--check-values``), the leftovers of interrupted writes, and how paths are named in
the report (relative to the step dir).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ckpt_tools.check import Check
from ckpt_tools.errors import CkptError
from ckpt_tools.inspect.report import InspectReport
from ckpt_tools.inspect.values import ValueScan, scan_safetensors
from ckpt_tools.io.fsutil import find_leftovers
from ckpt_tools.st.header import SafetensorsHeader, read_header


def relative(root: Path, path: Path) -> str:
    """``path`` as the report names it: relative to ``root`` when below it, else as given."""
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def header_check(path: Path, rel: str, report: InspectReport) -> SafetensorsHeader | None:
    """A ``<rel>`` check of one safetensors header (and its values, when they are checked); the header if readable."""
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
            values_check(rel, report, lambda: scan_safetensors(header, rel))
    return header


def values_check(rel: str, report: InspectReport, scan: Callable[[], ValueScan]) -> None:
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


def leftovers(base: Path, directories: list[Path], report: InspectReport) -> None:
    """Name what killed writes and interrupted deletions left in ``directories`` (a warning each)."""
    for directory in directories:
        for leftover in find_leftovers(directory):
            rel = relative(base, leftover.path)
            report.leftovers.append(rel)
            report.checks.append(Check.warn("leftover", f"{rel}: {leftover.describe()}"))
