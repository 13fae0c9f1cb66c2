"""``ckpt-tools verify-resume``: parse, call :func:`ckpt_tools.resume.verify.verify_resume`, print, exit 0/1."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ckpt_tools.cli import options as opt
from ckpt_tools.cli.app import app, emit_json, handled
from ckpt_tools.cli.untrusted import echo
from ckpt_tools.errors import ExitCode, UsageError

VERIFY_HELP = """Check every precondition of resuming CKPT and exit 0 only when the resume will work.

CKPT is a run dir or its checkpoints root (their `last`), a step dir, or its pretrained_model/. The target is
what `ckpt-train --resume=true --config_path=CKPT ...` would run with: the checkpoint's
train_config.json - or --config, the train_config.json of the run you will launch - with the
flags given here on top (each stands for the training flag in brackets), on --nproc processes
(default: R×S when both are given, else the saved world size). A checkpoint LeRobot wrote is
checked against LeRobot's own resume (`lerobot-train --resume=true`, LeRobot main's rules);
--trainer ckpt-train asks about ckpt-train's instead.

Fails on what stops the resume: missing or truncated files (safetensors headers vs sizes, DCP
chunk spans vs shard sizes), DCP metadata that does not cover the model, optimizer state that
does not cover every trainable parameter, the 0.6.x layout, a target the start-up checks refuse
(R×S ≠ processes, DCP format on a non-sharded run, ...), fp16 without scaler_state.json, the
RNG state missing on an unchanged world size, a PEFT base / --policy.path or dataset not found.
Warns on what the resume survives but changes: data order not sample-exact, effective batch or
precision changed, train_config.json disagreeing with training_step.json. --strict turns
warnings into failures (for CI gates that want an exact continuation).

\b
Examples:
  ckpt-tools verify-resume outputs/run/checkpoints
  ckpt-tools verify-resume outputs/run/checkpoints/last --nproc 4 --dp-replicate 2 --dp-shard 2 --strict
  ckpt-tools verify-resume outputs/run/checkpoints/005000 --config next_run/train_config.json --json
  ckpt-tools verify-resume ckpt --nproc 1 --dp-shard 1 --checkpoint-format safetensors
  ckpt-tools verify-resume outputs/run --load model

--load PARTS asks another question: would a NEW run start from CKPT's parts
(`ckpt-train --checkpoint.load_from=CKPT --checkpoint.load=PARTS`, PARTS a comma list of model,
optimizer, scheduler, scaler, rng or all)? Only those parts' checks run, the trainer's own: a
checkpoint whose optimizer state is damaged is loadable with --load model, not resumable.
A checkpoint of a run that started that way names where it was initialized from.

Exit codes: 0 resumable (with --load: loadable); 1 a check failed (or warned, with --strict); 2 bad flags;
3 CKPT (or --config) is missing or not a checkpoint.
"""

MARKS = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}


@app.command("verify-resume", help=VERIFY_HELP, no_args_is_help=True)
@handled
def verify_resume_command(
    checkpoint: opt.ResumeCheckpointArg,
    config: Annotated[
        Path | None, typer.Option("--config", help="train_config.json of the run that will resume.")
    ] = None,
    nproc: opt.OptionalNprocOpt = None,
    dp_replicate: opt.DpReplicateOpt = None,
    dp_shard: opt.DpShardOpt = None,
    batch_size: opt.BatchSizeOpt = None,
    grad_accum: opt.GradAccumOpt = None,
    mixed_precision: opt.MixedPrecisionOpt = None,
    checkpoint_format: opt.CheckpointFormatOpt = None,
    trainer: opt.TrainerOpt = None,
    output_dir: opt.OutputDirOpt = None,
    overwrite_checkpoints: opt.OverwriteCheckpointsOpt = False,
    strict: Annotated[bool, typer.Option("--strict", help="Treat warnings as failures.")] = False,
    skip_build: Annotated[
        bool,
        typer.Option(
            "--skip-build",
            help="Skip the trainer's build checks (dataset, policy on the meta device, load plan): torch-free, faster.",
        ),
    ] = False,
    load: Annotated[
        str | None,
        typer.Option(
            "--load",
            metavar="PARTS",
            help="Judge a new run's start from these parts (ckpt-train --checkpoint.load=PARTS), not a resume.",
        ),
    ] = None,
    json_out: opt.JsonOpt = False,
    no_cache: opt.NoCacheOpt = False,
) -> None:
    from ckpt_tools.hub.source import checkpoint_source
    from ckpt_tools.resume.verify import verify_load, verify_resume
    from ckpt_tools.retention.lease import reading_path

    request = opt.target_request(locals())
    if load is not None:
        _refuse_resume_flags(locals())
        with opt.fresh_reads(no_cache), checkpoint_source(checkpoint) as source, reading_path(source, "verify-resume"):
            report = verify_load(source, load, fp16=mixed_precision == "fp16")
    else:
        with opt.fresh_reads(no_cache), checkpoint_source(checkpoint) as source, reading_path(source, "verify-resume"):
            report = verify_resume(source, request, config=config, strict=strict, build=not skip_build)
    if json_out:
        emit_json(report.to_dict())
    else:
        print_report(report)
    if not report.resumable:
        raise typer.Exit(code=int(ExitCode.CHECK_FAILED))


RESUME_ONLY = {
    "config": "--config",
    "nproc": "--nproc",
    "dp_replicate": "--dp-replicate",
    "dp_shard": "--dp-shard",
    "batch_size": "--batch-size",
    "grad_accum": "--grad-accum",
    "checkpoint_format": "--checkpoint-format",
    "trainer": "--trainer",
    "output_dir": "--output-dir",
    "overwrite_checkpoints": "--overwrite-checkpoints",
    "strict": "--strict",
}


def _refuse_resume_flags(parameters: dict[str, Any]) -> None:
    """--load judges a new run's start, which loads onto any topology: a resume's target flags do not apply."""
    given = [flag for name, flag in RESUME_ONLY.items() if parameters.get(name) not in (None, False)]
    if given:
        raise UsageError(
            f"--load judges a new run's start from CKPT's parts, on any topology: {', '.join(given)} describe a resume"
        )


def print_report(report: Any) -> None:
    step = f" (step {report.step})" if report.step is not None else ""
    echo(f"verify-resume {report.checkpoint}{step}")
    echo(f"  {report.topology or 'unknown topology'} → {report.target or 'no valid target'}")
    width = max((len(c.name) for c in report.checks), default=0)
    for c in report.checks:
        echo(f"  {MARKS.get(c.status, c.status.upper())}  {c.name:<{width}}  {c.message}")
    warnings = sum(c.status == "warn" for c in report.checks)
    failed = len(report.failures)
    if report.load is not None:
        parts = ",".join(report.load)
        if report.resumable:
            echo(f"loadable: a new run can start from its {parts} (ckpt-train --checkpoint.load={parts})")
        else:
            echo(f"NOT LOADABLE: {failed} check{'s' if failed != 1 else ''} failed for --load {parts}")
        return
    if report.resumable:
        extra = f" ({warnings} warning{'s' if warnings != 1 else ''})" if warnings else ""
        echo(f"resumable{extra}")
    else:
        why = " (--strict: warnings count)" if report.strict and warnings else ""
        echo(f"NOT RESUMABLE: {failed} check{'s' if failed != 1 else ''} failed{why}")
