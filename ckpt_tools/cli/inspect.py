"""``ckpt-tools inspect``: parse, call :func:`ckpt_tools.inspect.inspect_path`, print, exit by health."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ckpt_tools.cli.app import app, emit_json, handled
from ckpt_tools.cli.options import JsonOpt, NoCacheOpt, fresh_reads
from ckpt_tools.cli.untrusted import echo, printable
from ckpt_tools.errors import ExitCode
from ckpt_tools.format.layout import TRAINING_STATE_DIR
from ckpt_tools.units import human_bytes, human_count

INSPECT_HELP = """Show what a checkpoint holds and check its health - reads headers and metadata only
(unless --check-values).

PATH is a checkpoints root, a step dir, pretrained_model/, training_state/, a DCP dir, a
single .safetensors file or a folder of them (torch's HF-storage pieces are shown as pieces of
their tensors), local or on the Hugging Face Hub as hf://OWNER/REPO[@REVISION][/PATH] (only the
JSON records, metadata and headers are downloaded, by ranged reads). Prints the formats present, PEFT or not, processors, the run's
topology and batch factorization (training_step.json), parameters and bytes by dtype,
per-rank shard sizes, and health checks: every file docs/checkpoint-format.md requires for the recorded
format, metadata consistency, chunk coverage, file sizes, safetensors headers. --check-values
also reads every tensor's data (the whole checkpoint, a block at a time) and counts NaN and
infinite values per tensor: any makes the checkpoint UNHEALTHY. --verify-data reads every byte
of every file the save recorded against the full digests it computed while writing them
(bounded memory; it reports the speed): a flipped bit anywhere makes the checkpoint UNHEALTHY.
A checkpoint whose save kept no such record (LeRobot's, other producers', older ones) gets a
line saying that no per-byte verification is possible, and stays healthy.

\b
Examples:
  ckpt-tools inspect outputs/train/checkpoints
  ckpt-tools inspect outputs/train/checkpoints/last --tensors
  ckpt-tools inspect outputs/train/checkpoints/005000/pretrained_model/pytorch_model_fsdp_0 --json
  ckpt-tools inspect model.safetensors
  ckpt-tools inspect hf://alice/act-pick-place
  ckpt-tools inspect outputs/train/checkpoints/last --check-values
  ckpt-tools inspect outputs/train/checkpoints/last --verify-data

Exit codes: 0 healthy; 1 a health check failed; 2 a malformed hf:// path; 3 PATH is missing or not a
checkpoint; 5 the Hub or the network to it failed.
"""
NONFINITE_SHOWN = 20  # tensors with NaN or inf listed in the text output
RANKS_SHOWN = 8  # saving ranks listed per DCP directory in the text output


@app.command("inspect", help=INSPECT_HELP, no_args_is_help=True)
@handled
def inspect_command(
    path: Annotated[str, typer.Argument(metavar="PATH", help="Checkpoint path, local or hf:// (see above).")],
    tensors: Annotated[bool, typer.Option("--tensors", help="List every tensor: name, dtype, shape, chunks.")] = False,
    check_values: Annotated[
        bool,
        typer.Option(
            "--check-values",
            help="Also read every tensor's data and count NaN and infinite values per tensor (any is UNHEALTHY);"
            " reads the whole checkpoint (on a checkpoints root: every step).",
        ),
    ] = False,
    verify_data: Annotated[
        bool,
        typer.Option(
            "--verify-data",
            help="Also read every byte of every file the save recorded against its full digests (a flipped bit"
            " is UNHEALTHY); no record: a line saying so. Reads the whole checkpoint (a root: every step).",
        ),
    ] = False,
    keep_last: Annotated[
        int | None,
        typer.Option(
            "--keep-last",
            min=1,
            help="On a run: which steps retention of the newest K would remove, and why each other stays"
            " (default: the run's own --checkpoint.keep_last_n, if it has one). Removes nothing.",
        ),
    ] = None,
    json_out: JsonOpt = False,
    no_cache: NoCacheOpt = False,
) -> None:
    from ckpt_tools.hub.source import checkpoint_source
    from ckpt_tools.inspect import inspect_path
    from ckpt_tools.io.progress import bytes_read, on_terminal

    reads_every_byte = check_values or verify_data  # the others read headers only: a fraction of a second
    bar = on_terminal(reads_every_byte and not json_out)
    with fresh_reads(no_cache), checkpoint_source(path) as source, bytes_read("inspect", enabled=bar):
        report = inspect_path(
            source, tensors=tensors, check_values=check_values, verify_data=verify_data, keep_last=keep_last
        )
    if json_out:
        emit_json(report.to_dict())
    else:
        _print_report(report, tensors)
    if not report.healthy:
        raise typer.Exit(code=int(ExitCode.CHECK_FAILED))


def _print_report(report: Any, tensors: bool) -> None:
    echo(f"{report.path}  ({report.kind.replace('_', ' ')})")
    if report.kind in ("checkpoints_root", "trainer_root"):
        steps = ", ".join(f"{s.name}{'' if s.healthy else ' (UNHEALTHY)'}" for s in report.steps) or "none"
        echo(f"  steps: {steps}")
        if report.kind == "checkpoints_root":
            echo(f"  last -> {report.last or '(none)'}")
        else:
            echo(f"  newest: {report.inspected_step or '(none)'} (what convert-dcp takes for this folder)")
        for name in report.partial_saves:
            echo(f"  partial save: {name} (a save that never completed; resume ignores it)")
        if report.retention is not None:
            r = report.retention
            echo(
                f"  retention (keep_last_n={r.keep_last_n}, from {r.source}): would remove"
                f" {', '.join(r.removes) or 'nothing'}"
            )
            for name, reasons in r.keeps.items():
                echo(f"    keeps {name}: {', '.join(reasons)}")
        if report.inspected_step:
            echo(f"Step {report.inspected_step}:")
    if report.step is not None or report.training_step is not None:
        step = report.step if report.step is not None else (report.training_step or {}).get("step")
        echo(f"  step {step}; formats: {', '.join(report.formats) or 'none'}; PEFT: {_yes(report.peft)}")
        echo(f"  processors: {', '.join(report.processors) or 'none'}")
        echo(f"  topology: {report.topology or 'unknown (no training_step.json)'}")
        if report.batch:
            echo(f"  batch: {report.batch}")
        if report.initialized_from:
            echo(f"  initialized from: {report.initialized_from}")
    for w in report.weights:
        dtypes = ", ".join(f"{k} {human_bytes(v)}" for k, v in sorted(w.bytes_by_dtype.items(), key=lambda kv: -kv[1]))
        optimizer = w.path.startswith(TRAINING_STATE_DIR)
        kind, values = ("optimizer state", "values") if optimizer else ("weights", "parameters")
        echo(
            f"  {kind} {w.path} ({w.format}): {w.tensors} tensors, {human_count(w.parameters)} {values},"
            f" {human_bytes(w.bytes)}{f' ({dtypes})' if dtypes else ''}"
        )
        for r in w.ranks[:RANKS_SHOWN]:
            echo(f"    rank {r.rank}: {len(r.files)} file(s), {human_bytes(r.file_bytes)}, {r.chunks} chunks")
        if len(w.ranks) > RANKS_SHOWN:
            rest = w.ranks[RANKS_SHOWN:]
            sizes = [r.file_bytes for r in rest]
            echo(
                f"    ... {len(rest)} more ranks: {human_bytes(min(sizes))}-{human_bytes(max(sizes))} each,"
                f" {sum(r.chunks for r in rest)} chunks (--json lists every one)"
            )
    for note in report.notes:
        echo(f"  note: {note}")
    if tensors and report.tensors:
        names = [printable(t.name) for t in report.tensors]  # as shown, so the columns align
        width = max(map(len, names))
        echo("Tensors:")
        for name, t in zip(names, report.tensors, strict=True):
            chunks = f"  {len(t.chunks)} chunks" if t.chunks else ""
            if len(t.chunks) == 1 and t.chunks[0]["sizes"] != list(t.shape):  # a piece of a larger tensor
                chunks = f"  piece {t.chunks[0]['sizes']} at {t.chunks[0]['offsets']}"
            echo(f"  {name:<{width}}  {t.dtype:<9} {list(t.shape)}{chunks}")
    if report.nonfinite:
        echo("Non-finite values:")
        for n in report.nonfinite[:NONFINITE_SHOWN]:
            echo(f"  {n.file}: {n.tensor}: {n.nan} NaN, {n.inf} inf")
        if len(report.nonfinite) > NONFINITE_SHOWN:
            echo(f"  ... and {len(report.nonfinite) - NONFINITE_SHOWN} more tensors (--json lists every one)")
    echo("Checks:")
    for c in report.checks:
        mark = {"pass": "ok  ", "fail": "FAIL"}.get(c.status, c.status)
        echo(f"  {mark} {c.name}: {c.message}")
    failed = sum(c.failed for c in report.checks)
    echo("healthy" if report.healthy else f"UNHEALTHY: {failed} check(s) failed")


def _yes(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")
