"""``ckpt-tools prune``: keep a finished (or stopped) run's newest K checkpoints, remove the others."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ckpt_tools.cli.app import EXIT_CODES_HELP, app, emit_json, handled
from ckpt_tools.cli.options import JsonOpt
from ckpt_tools.cli.untrusted import echo
from ckpt_tools.errors import CheckpointError, WriteError
from ckpt_tools.format import layout
from ckpt_tools.io.dir_lock import DirLock
from ckpt_tools.retention import apply_retention, read_run_steps

PRUNE_HELP = f"""Remove a run's older checkpoint steps, keeping the newest K (what --checkpoint.keep_last_n does in the trainer).

RUN is a run's output dir or its checkpoints/ dir. A step is kept when it is among the newest K,
when `last` points at it, when it is the newest resumable step, or while a tool reading it
(convert-dcp, push, verify-resume) holds a lease on it; the output says which. Each step goes by
one rename out of the step names, then removal: a kill leaves a hidden .NNNNNN.deleting-* that
the next prune (or the trainer's retention) finishes, never a half step. Refused while a trainer
(or another prune) owns the run; prune owns it while it removes, so no trainer starts meanwhile.

\b
Examples:
  ckpt-tools prune outputs/train --keep-last 2 --dry-run
  ckpt-tools prune outputs/train/checkpoints --keep-last 1 --json

{EXIT_CODES_HELP}
"""


def checkpoints_root_of(run: Path) -> tuple[Path, Path]:
    """(checkpoints root, run dir) for RUN: an output dir holding ``checkpoints/``, or that dir itself."""
    if (run / layout.CHECKPOINTS_DIR).is_dir():
        return run / layout.CHECKPOINTS_DIR, run
    if run.name == layout.CHECKPOINTS_DIR and run.is_dir():
        return run, run.parent
    raise CheckpointError(f"{run}: not a run (no {layout.CHECKPOINTS_DIR}/ in it, and not one itself)")


@app.command("prune", help=PRUNE_HELP, no_args_is_help=True)
@handled
def prune_command(
    run: Annotated[Path, typer.Argument(metavar="RUN", help="A run's output dir, or its checkpoints/ dir.")],
    keep_last: Annotated[int, typer.Option("--keep-last", min=1, help="How many of the newest steps to keep (≥ 1).")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would go and what stays; remove nothing.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    root, run_dir = checkpoints_root_of(run)
    if dry_run:
        facts = read_run_steps(root)
        plan = facts.plan(keep_last)
        _report(root, keep_last, facts.steps, plan, [], [], [], dry_run=True, json_out=json_out)
        return
    lock = DirLock(run_dir, "ckpt-tools prune")
    lock.acquire_for_writing("nothing removed: prune a run once its trainer has ended", "; nothing removed")
    try:
        outcome = apply_retention(root, keep_last)
    except OSError as e:
        raise WriteError(f"{root}: removing a step failed ({e.strerror or e}); every step left is whole") from None
    finally:
        lock.release()
    _report(
        root,
        keep_last,
        outcome.facts.steps,
        outcome.plan,
        outcome.removed,
        outcome.taken_meanwhile,
        outcome.notes,
        dry_run=False,
        json_out=json_out,
    )


def _report(
    root: Path,
    keep_last: int,
    steps: dict[int, Path],
    plan: Any,
    removed: list[int],
    taken: list[int],
    notes: list[str],
    *,
    dry_run: bool,
    json_out: bool,
) -> None:
    def name(step: int) -> str:
        return steps[step].name

    kept = {name(f.step): list(f.reasons) for f in plan.kept}
    for step in taken:
        kept[name(step)] = ["in use (taken by a reader during the prune)"]
    if json_out:
        emit_json(
            {
                "checkpoints": str(root),
                "keep_last": keep_last,
                "dry_run": dry_run,
                "would_remove": [name(s) for s in plan.removed],
                "removed": [name(s) for s in removed],
                "kept": dict(sorted(kept.items())),
                "notes": notes,
            }
        )
        return
    echo(f"{root}: keep the newest {keep_last}{' (dry run: nothing is removed)' if dry_run else ''}")
    for fate in plan.fates:
        if fate.step in removed or (dry_run and not fate.kept):
            echo(f"  {'would remove' if dry_run else 'removed'} {name(fate.step)}")
        else:
            echo(f"  kept {name(fate.step)}: {', '.join(kept[name(fate.step)])}")
    for note in notes:
        echo(f"  note: {note}")
    count = len(plan.removed) if dry_run else len(removed)
    echo(f"{'would remove' if dry_run else 'removed'} {count} step(s), kept {len(kept)}")
