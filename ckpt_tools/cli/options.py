"""Options shared by several commands, declared once as ``Annotated`` aliases.

``reshard-plan`` and ``verify-resume`` describe the resumed run with the same flags, each
standing for the training flag in brackets; both hand them to the API as one
:class:`~ckpt_tools.resume.target.TargetRequest`. A flag's spelling and help text live here,
so the two commands cannot drift apart. ``--json`` means the same for every command.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from ckpt_tools.resume.target import TargetRequest

_NPROC_HELP = "Processes of the resumed run (world size)."

ResumeCheckpointArg = Annotated[
    str,
    typer.Argument(
        metavar="CKPT", help="Checkpoints root, step dir or pretrained_model/; local or hf://OWNER/REPO[@REV][/PATH]."
    ),
]
NprocOpt = Annotated[int, typer.Option("--nproc", help=_NPROC_HELP)]
OptionalNprocOpt = Annotated[int | None, typer.Option("--nproc", help=_NPROC_HELP)]
DpReplicateOpt = Annotated[
    int | None, typer.Option("--dp-replicate", help="Replica groups R [--parallelism.dp_replicate].")
]
DpShardOpt = Annotated[
    int | None, typer.Option("--dp-shard", help="Shards per group S, -1 = all [--parallelism.dp_shard].")
]
BatchSizeOpt = Annotated[int | None, typer.Option("--batch-size", help="Per-worker batch [--batch_size].")]
GradAccumOpt = Annotated[int | None, typer.Option("--grad-accum", help="[--accelerator.gradient_accumulation.steps].")]
NnodesOpt = Annotated[int | None, typer.Option("--nnodes", help="Nodes the processes are spread over.")]
MixedPrecisionOpt = Annotated[
    str | None, typer.Option("--mixed-precision", help="no, bf16 or fp16 [--accelerator.mixed_precision].")
]
CheckpointFormatOpt = Annotated[
    str | None,
    typer.Option("--checkpoint-format", help="safetensors, dcp or safetensors_dcp [--checkpoint_format]."),
]
TrainerOpt = Annotated[
    str | None,
    typer.Option(
        "--trainer",
        help="Whose resume to predict: ckpt-train or lerobot-train (default: the trainer that wrote CKPT).",
    ),
]
OutputDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--output-dir",
        help="Where the resumed run writes [--output_dir] (default: the run the checkpoint is in).",
    ),
]
OverwriteCheckpointsOpt = Annotated[
    bool,
    typer.Option(
        "--overwrite-checkpoints",
        help="The resume may replace checkpoints after the resumed step [--overwrite_checkpoints=true].",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (one document on stdout).")]
# The EMA weights (pretrained_model_ema/) instead of the live ones: a --ema.enable=true run's shadow.
EmaOpt = Annotated[
    bool,
    typer.Option("--ema", help="Use the EMA weights (pretrained_model_ema/) instead of the live ones."),
]
NoCacheOpt = Annotated[
    bool,
    typer.Option(
        "--no-cache",
        help="Read every DCP .metadata and chunk header afresh: use neither the save's .metadata.index nor"
        " the cache of earlier looks (~/.cache/ckpt_tools, or $CKPT_TOOLS_CACHE_DIR), and add nothing to it.",
    ),
]


@contextlib.contextmanager
def fresh_reads(no_cache: bool) -> Iterator[None]:
    """Within the block, ``--no-cache``'s choice (:func:`ckpt_tools.dcp.sources.reading`)."""
    if not no_cache:
        yield
        return
    from ckpt_tools.dcp.sources import reading

    with reading(index=False, cache=False):
        yield


def target_request(parameters: Mapping[str, Any]) -> TargetRequest:
    """The :class:`TargetRequest` of a command's parsed parameters (its ``locals()``).

    A command's target flags are named as the request's fields (``nproc``, ``dp_shard``, ...),
    so a command that gains a target flag passes it on without another line.
    """
    from ckpt_tools.resume.target import TargetRequest

    names = {f.name for f in dataclasses.fields(TargetRequest)}
    return TargetRequest(**{name: value for name, value in parameters.items() if name in names})
