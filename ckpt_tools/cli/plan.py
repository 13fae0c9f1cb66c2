"""``ckpt-tools reshard-plan``: parse, call :func:`ckpt_tools.resume.plan.plan_reshard`, print, exit by verdict."""

from __future__ import annotations

from typing import Any

import typer

from ckpt_tools.cli import options as opt
from ckpt_tools.cli.app import app, emit_json, handled
from ckpt_tools.cli.render import table
from ckpt_tools.cli.untrusted import echo
from ckpt_tools.errors import ExitCode
from ckpt_tools.units import human_bytes

PLAN_HELP = """Predict what resuming CKPT on another topology will do - reads metadata only, no torch.

CKPT is a run dir or its checkpoints root (their `last`), a step dir, or its pretrained_model/. The target is
what `ckpt-train --resume=true --config_path=CKPT ...` would run with on --nproc processes: the
checkpoint's train_config.json, overridden by the flags given here (each one stands for the
training flag in brackets). Without --dp-replicate/--dp-shard the saved config's values apply,
as they would on resume (dp_shard=-1: all processes).

Prints the source and target topology (DDP / FSDP / HSDP); per target rank, the bytes it reads
from each shard file (exactly the chunk spans torch's DCP loader requests; safetensors files are
read whole by every rank) and the bytes it then holds for parameters, gradients and optimizer
state (FSDP2's dim-0 sharding); the effective batch before and after; whether the data order
stays sample-exact and where the sampler resumes; a linear-scaling suggestion for the learning
rate and steps (never applied); and what cannot work, and why.

\b
Examples:
  ckpt-tools reshard-plan outputs/run/checkpoints --nproc 4 --dp-replicate 2 --dp-shard 2
  ckpt-tools reshard-plan outputs/run/checkpoints/last --nproc 1 --dp-shard 1 --checkpoint-format safetensors
  ckpt-tools reshard-plan outputs/run/checkpoints/005000 --nproc 16 --dp-shard -1 --nnodes 2 --json

Exit codes: 0 the resume can work; 1 something stands in its way (listed); 2 bad flags;
3 CKPT is missing, not a checkpoint, or its training_step.json is unreadable.
"""


@app.command("reshard-plan", help=PLAN_HELP, no_args_is_help=True)
@handled
def reshard_plan_command(
    checkpoint: opt.ResumeCheckpointArg,
    nproc: opt.NprocOpt,
    dp_replicate: opt.DpReplicateOpt = None,
    dp_shard: opt.DpShardOpt = None,
    batch_size: opt.BatchSizeOpt = None,
    grad_accum: opt.GradAccumOpt = None,
    nnodes: opt.NnodesOpt = None,
    mixed_precision: opt.MixedPrecisionOpt = None,
    checkpoint_format: opt.CheckpointFormatOpt = None,
    trainer: opt.TrainerOpt = None,
    output_dir: opt.OutputDirOpt = None,
    overwrite_checkpoints: opt.OverwriteCheckpointsOpt = False,
    json_out: opt.JsonOpt = False,
    no_cache: opt.NoCacheOpt = False,
) -> None:
    from ckpt_tools.hub.source import checkpoint_source
    from ckpt_tools.resume.plan import plan_reshard

    request = opt.target_request(locals())
    with opt.fresh_reads(no_cache), checkpoint_source(checkpoint) as source:
        plan = plan_reshard(source, request)
    if json_out:
        emit_json(plan.to_dict())
    else:
        print_plan(plan)
    if not plan.workable:
        raise typer.Exit(code=int(ExitCode.CHECK_FAILED))


def print_plan(plan: Any) -> None:
    echo(f"Reshard plan for {plan.checkpoint} (step {plan.step})")
    rows = [
        ["source", plan.source.description if plan.source else "unknown (no topology recorded)"],
        ["target", plan.target.description if plan.target else _refused(plan.target_world_size)],
        ["weights", plan.weights or "none usable"],
        ["optimizer", plan.optimizer or "none usable"],
    ]
    for name, value in rows:
        echo(f"  {name:<10} {value}")
    if plan.rank_groups:
        echo("")
        echo("Per rank: bytes read from the checkpoint, and local bytes held after the load")
        for line in _rank_table(plan).splitlines():
            echo(line)
        echo("")
        echo("Files each rank reads")
        for line in _file_lines(plan):
            echo(line)
    echo("")
    echo("Batch")
    echo(f"  before     {plan.batch_before.describe() if plan.batch_before else 'unknown'}")
    echo(f"  after      {plan.batch_after.describe() if plan.batch_after else 'unknown'}")
    if plan.data is not None:
        echo(f"  data order {plan.data.explanation}")
    if plan.suggestion is not None and plan.suggestion.explanation:
        echo(f"  suggestion {plan.suggestion.explanation}")
    # data-order and effective-batch warnings repeat the Batch section above
    warnings = [f"{c.name}: {c.message}" for c in plan.warnings if c.name not in ("data-order", "effective-batch")]
    blockers = [f"{c.name}: {c.message}" for c in plan.blockers]
    for title, items in (("Notes", plan.notes), ("Warnings", warnings), ("Cannot work", blockers)):
        if items:
            echo("")
            echo(title)
            for item in items:
                echo(f"  - {item}")
    echo("")
    if plan.workable:
        echo("verdict: the resume can work on this topology")
    else:
        echo(f"verdict: CANNOT WORK ({len(plan.blockers)} blocker{'s' if len(plan.blockers) != 1 else ''})")


def _refused(world: int) -> str:
    return f"{world} process{'es' if world != 1 else ''}: refused at start-up (see Cannot work)"


def _rank_table(plan: Any) -> str:
    """One row per rank in a small world; otherwise one row per group of ranks with the same numbers."""
    headers = [
        "rank",
        "mesh (R,S)",
        "node",
        "weights read",
        "optim read",
        "other read",
        "params",
        "grads",
        "optim state",
        "resident",
    ]
    if 0 < len(plan.ranks) <= 16:
        rows = [
            [
                str(r.rank),
                f"({r.replica},{r.shard})",
                "-" if r.node is None else str(r.node),
                *_cells(r, r.resident_complete),
            ]
            for r in plan.ranks
        ]
    else:
        merged: dict[tuple[str, ...], list[Any]] = {}
        for g in plan.rank_groups:
            merged.setdefault(tuple(_cells(g, g.complete)), []).append(g)
        rows = [[_ranks_label(groups, prefix=False), "-", "-", *cells] for cells, groups in merged.items()]
    return table(headers, rows, right=(3, 4, 5, 6, 7, 8, 9))


def _cells(r: Any, complete: bool) -> list[str]:
    """The byte columns of a rank's (or a group's) row; ``+``: a PEFT base whose size is unknown."""
    mark = "" if complete else "+"
    return [
        human_bytes(r.role_bytes("weights")),
        human_bytes(r.role_bytes("optimizer")),
        human_bytes(r.role_bytes("state") + r.role_bytes("base")),
        human_bytes(r.resident.params) + mark,
        human_bytes(r.resident.grads),
        human_bytes(r.resident.optimizer),
        human_bytes(r.resident.total) + mark,
    ]


GROUPS_SHOWN = 8  # groups of ranks whose file reads are listed; --json has every one
FILES_SHOWN = 12  # files listed per group


def _file_lines(plan: Any) -> list[str]:
    """DCP shard reads per rank (ranks reading the same collapse), then the files every rank reads whole."""
    by_reads: dict[tuple[Any, ...], list[Any]] = {}
    for g in plan.rank_groups:
        key = tuple((f.path, f.bytes, f.requests) for f in g.reads if f.how == "dcp-chunks")
        by_reads.setdefault(key, []).append(g)
    lines = []
    for shown, (key, groups) in enumerate(by_reads.items()):
        if shown == GROUPS_SHOWN:
            rest = list(by_reads)[GROUPS_SHOWN:]
            files = [len(k) for k in rest]
            total = [sum(size for _, size, _ in k) for k in rest]
            lines.append(
                f"  ... and {len(rest)} more groups of ranks reading other shards: {min(files)}-{max(files)} files,"
                f" {human_bytes(min(total))}-{human_bytes(max(total))} each (--json lists every one)"
            )
            break
        label = f"  {_ranks_label(groups)}:"
        if not key:
            lines.append(f"{label} no DCP shards")
            continue
        lines.append(label)
        rows = [[path, human_bytes(size), str(n)] for path, size, n in key[:FILES_SHOWN]]
        if len(key) > FILES_SHOWN:
            more = key[FILES_SHOWN:]
            rows.append(
                [
                    f"... {len(more)} more files",
                    human_bytes(sum(size for _, size, _ in more)),
                    str(sum(n for _, _, n in more)),
                ]
            )
        lines.extend(table(["file", "bytes", "requests"], rows, right=(1, 2), indent=4).splitlines())
    groups = plan.rank_groups
    whole = [f for f in groups[0].reads if f.how == "whole-file"] if groups else []
    if whole:
        lines.append("  every rank, whole files: " + ", ".join(f"{f.path} ({human_bytes(f.bytes)})" for f in whole))
    return lines


def _ranks_label(groups: list[Any], *, prefix: bool = True) -> str:
    """``rank 3``, ``ranks 0-2,5`` - or, in a world too big to list, the shard indices on every replica."""
    from ckpt_tools.resume.plan import describe_ranks

    first = groups[0]
    text = describe_ranks([i for g in groups for i in g.shards], first.replicas, first.dp_shard)
    if not prefix:
        return text
    count = sum(g.count for g in groups)
    return f"ranks at {text}" if text.startswith("shard") else f"rank{'s' if count > 1 else ''} {text}"
