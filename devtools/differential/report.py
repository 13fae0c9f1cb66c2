"""Count a campaign's cases per family and print them as a text table and a markdown table.

One row per mutation family: how many cases ran, how often ``verify-resume`` said yes, how
the real resumes ended, and the disagreements - verify false yes / false no, inspect false
healthy / false unhealthy - plus the tools' own defects (a traceback or an undocumented exit)
and the resumes that crashed. The counts are the whole result: there is no expected value.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from devtools.differential.runner import CaseResult

COLUMNS = (
    ("cases", "cases"),
    ("verify yes", "verify_yes"),
    ("resume equal", "resume_equal"),
    ("resume different", "resume_different"),
    ("resume refused", "resume_refused"),
    ("resume crash", "resume_traceback"),
    ("resume not run", "resume_not_run"),
    ("verify false yes", "verify_false_yes"),
    ("verify false no", "verify_false_no"),
    ("verify errors", "verify_error"),
    ("inspect false healthy", "inspect_false_healthy"),
    ("inspect false unhealthy", "inspect_false_unhealthy"),
    ("inspect errors", "inspect_error"),
)


def counts(results: Iterable[CaseResult]) -> dict[str, Counter[str]]:
    """family -> column key -> count (and the row ``all``)."""
    rows: dict[str, Counter[str]] = {}
    for result in results:
        for row in (result.spec.family, "all"):
            c = rows.setdefault(row, Counter())
            c["cases"] += 1
            c["verify_yes"] += result.verify.get("rc") == 0
            outcome = result.resume.get("outcome")
            c["resume_equal"] += outcome == "equal"
            c["resume_different"] += outcome == "different"
            c["resume_refused"] += outcome == "refused"
            c["resume_not_run"] += outcome == "not-run"
            for key, value in result.verdicts.items():
                c[key] += bool(value)
    return dict(sorted(rows.items(), key=lambda kv: (kv[0] == "all", kv[0])))


def text_table(rows: dict[str, Counter[str]]) -> str:
    header = ["family", *(title for title, _ in COLUMNS)]
    body = [[name, *(str(c[key]) for _, key in COLUMNS)] for name, c in rows.items()]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True)))
        for r in [header, *body]
    )


def markdown_table(rows: dict[str, Counter[str]]) -> str:
    header = ["family", *(title for title, _ in COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, c in rows.items():
        label = f"**{name}**" if name == "all" else name
        lines.append("| " + " | ".join([label, *(str(c[key]) for _, key in COLUMNS)]) + " |")
    return "\n".join(lines)


def by_base(results: Iterable[CaseResult]) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {}
    for result in results:
        c = out.setdefault(result.spec.base, Counter())
        c["cases"] += 1
        c["disagreements"] += bool(result.disagreements)
    return dict(sorted(out.items()))
