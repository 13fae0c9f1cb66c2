"""What changed in ``train_config.json`` since the save, and whether the continuation stays the saved run's.

``train_config.json`` is the user's to edit: a moved dataset or output directory is fixed there,
and a resume starts from it. But most of its fields decide the numbers - the gradient clip, the
warm-up, the schedule's length and floor, dropout, the random seed - and a resume from an edited file
runs with the edited values: a continuation that differs from what the saved run would have
done, with nothing saying so (the save's files are the save's; only the config changed). The
record of the save's files keeps the config as it was saved (:mod:`.save_files`), so the change
is named field by field. The trainer prints it as a warning at start-up; ``verify-resume``
warns with the same line (``--strict``: fails).

Fields that only say where things are or how the run reports are not changes of the run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

# Dotted fields an edit of which leaves the numbers of the continuation as they were.
PLACES_AND_REPORTING = frozenset(
    {
        "output_dir",
        "job_name",
        "dataset.root",
        "dataset.repo_id",
        "dataset.revision",
        "policy.repo_id",
        "policy.private",
        "log_freq",
        "log_samples",
        "progress_bar",
        "save_freq",
        "save_checkpoint",
        "checkpoint_async",
        "checkpoint.keep_last_n",
        "checkpoint.last_link",
        "collective_timeout_s",
        "resume",
        "overwrite_checkpoints",
    }
)
GROUPS_OF_REPORTING = ("trackio.",)
LISTED = 3

Change = tuple[str, object, object]  # dotted field, saved value, value now (a _MISSING sentinel: absent)


class _Missing:
    def __repr__(self) -> str:
        return "(absent)"


MISSING: Any = _Missing()


def changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change]:
    """Every leaf field whose value differs, in the saved file's order then the new fields."""
    before, after = dict(_leaves(saved)), dict(_leaves(now))
    keys = list(before) + [k for k in after if k not in before]
    return [
        (k, before.get(k, MISSING), after.get(k, MISSING))
        for k in keys
        if before.get(k, MISSING) != after.get(k, MISSING)
    ]


def run_changes(found: list[Change]) -> list[Change]:
    """The changes that make the continuation differ from the saved run."""
    return [c for c in found if c[0] not in PLACES_AND_REPORTING and not c[0].startswith(GROUPS_OF_REPORTING)]


def describe(found: list[Change]) -> str:
    shown = ", ".join(f"{name} {before!r} → {after!r}" for name, before, after in found[:LISTED])
    more = f" (and {len(found) - LISTED} more)" if len(found) > LISTED else ""
    return shown + more


def warning(saved: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> str | None:
    """The line for an edit that changes the run (None: no such edit, or nothing to compare)."""
    if saved is None or now is None:
        return None
    found = run_changes(changes(saved, now))
    if not found:
        return None
    return (
        f"train_config.json was edited after the save: {describe(found)} - the resume runs with the edited"
        " values, so it does not continue as the saved run would have"
    )


def _leaves(doc: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in doc.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, f"{dotted}.")
        else:
            yield dotted, value
