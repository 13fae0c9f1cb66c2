"""``ckpt-tools convert-dcp``: parse into a :class:`~ckpt_tools.convert.options.ConvertOptions`, convert, print.

Heavy modules (numpy, tqdm, huggingface_hub) are imported by the API only when a conversion
actually runs, so ``--help`` and bad flags answer at once.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ckpt_tools.cli.app import EXIT_CODES_HELP, app, emit_json, handled
from ckpt_tools.cli.options import EmaOpt, JsonOpt, NoCacheOpt, fresh_reads
from ckpt_tools.cli.untrusted import echo
from ckpt_tools.errors import UsageError
from ckpt_tools.hub.location import is_hub_path
from ckpt_tools.hub.source import checkpoint_source
from ckpt_tools.retention.lease import reading_path
from ckpt_tools.units import human_bytes

if TYPE_CHECKING:
    from ckpt_tools.convert import ConvertOptions, ConvertResult
    from ckpt_tools.hub.push import HubPushError, PushResult

CONVERT_HELP = f"""Merge DCP shards (pytorch_model_fsdp_0/) into a regular model.safetensors - offline, on CPU, no torch.

CHECKPOINT_DIR is a step dir, its pretrained_model/, a DCP dir itself, or a checkpoints root
or the run dir holding it (its `last` step), or another trainer's folder of step-N/ saves
(torchtitan's checkpoint/: its newest). Tensors stream one by one: memory stays about one tensor whatever the model
size. PEFT checkpoints give adapter_model.safetensors with peft's key names. The model is found
by its shape - under `model`, torchtitan's top-level entries, app.model of PyTorch's DCP recipe -
never mixed with optimizer or other training state; --key names the part when several could be.
The output goes next to the shards (pretrained_model/), or inside a bare DCP dir (step-N/),
unless --output says otherwise, through a temporary
file renamed into place: a failure leaves no partial output and the shards untouched.
--delete-dcp removes the shards only after the written files were read back and verified, and
only when what remains still resumes bit-exactly (the converted file is what the trainer loads,
at the saved dtype); --allow-unresumable deletes them anyway. A rerun after a kill cleans up
and finishes what the killed run left.

Also read: DCP with rank-local metadata (__<r>.metadata) or zstd-compressed chunks (needs
zstandard), and torch's HF-storage pieces (a folder of shard-*-model-*.safetensors written with
save_distributed), merged by their DCP_SHARDING_INFO into --output. Safetensors that already
hold whole tensors have nothing to convert. Every dtype safetensors can hold is copied through;
a tensor it cannot hold (complex128, ...) is skipped with a note.

\b
Examples:
  ckpt-tools convert-dcp outputs/train/checkpoints/last
  ckpt-tools convert-dcp --checkpoint-dir outputs/train/checkpoints/005000 --dtype bf16
  ckpt-tools convert-dcp CKPT --max-shard-size 2GB --output exported/
  ckpt-tools convert-dcp CKPT --dry-run --json
  ckpt-tools convert-dcp CKPT --what optimizer      # training_state/optimizer_0 → optimizer_state_flat.safetensors
  ckpt-tools convert-dcp outputs/titan/checkpoint  # torchtitan: the newest step-N, its model entries
  ckpt-tools convert-dcp checkpoint --key app.model # one part of a nested state dict
  ckpt-tools convert-dcp CKPT --delete-dcp --push-to-hub alice/act-pusht

{EXIT_CODES_HELP}
"""


@app.command("convert-dcp", help=CONVERT_HELP, no_args_is_help=True)
@handled
def convert_dcp_command(
    checkpoint: Annotated[
        str | None,
        typer.Argument(
            metavar="[CHECKPOINT_DIR]", help="Step dir, pretrained_model/ or DCP dir; local or hf://OWNER/REPO[/PATH]."
        ),
    ] = None,
    checkpoint_dir: Annotated[
        str | None, typer.Option("--checkpoint-dir", "--checkpoint_dir", help="Same as CHECKPOINT_DIR.")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Output directory, or a .safetensors file path when not sharded."),
    ] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="fp32, bf16 or fp16 for floating tensors (default: as saved).")
    ] = None,
    max_shard_size: Annotated[
        str | None,
        typer.Option("--max-shard-size", help="Split into Hub-style shards + index: bytes or 500MB, 2GB, 1GiB."),
    ] = None,
    what: Annotated[str | None, typer.Option("--what", help="model (default) or optimizer.")] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            metavar="PATH",
            help="Dotted key path of the part to convert (app.model); default: the model, found by its shape.",
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and sizes; write nothing.")] = False,
    delete_dcp: Annotated[
        bool, typer.Option("--delete-dcp", help="Delete the DCP shards after the output is written and verified.")
    ] = False,
    allow_unresumable: Annotated[
        bool,
        typer.Option(
            "--allow-unresumable",
            help="With --delete-dcp: delete even when what remains no longer resumes bit-exactly"
            " (--dtype casts, --what optimizer, --output elsewhere).",
        ),
    ] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace existing output files.")] = False,
    push_to_hub: Annotated[
        str | None, typer.Option("--push-to-hub", metavar="REPO", help="Publish the converted folder to the Hub.")
    ] = None,
    private: Annotated[bool, typer.Option("--private", help="With --push-to-hub: create the repo private.")] = False,
    json_out: JsonOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    no_cache: NoCacheOpt = False,
    ema: EmaOpt = False,
) -> None:
    if checkpoint is not None and checkpoint_dir is not None and checkpoint != checkpoint_dir:
        raise UsageError("give the checkpoint either as CHECKPOINT_DIR or with --checkpoint-dir, not both")
    source = checkpoint_dir or checkpoint
    if source is None:
        raise UsageError("missing CHECKPOINT_DIR (or --checkpoint-dir)")
    from ckpt_tools.convert.options import ConvertOptions

    options = ConvertOptions(
        output=output,
        dtype=dtype,
        max_shard_size=max_shard_size,
        what=what,
        key=key,
        overwrite=overwrite,
        delete_dcp=delete_dcp,
        allow_unresumable=allow_unresumable,
        ema=ema,
        dry_run=dry_run,
    )
    refuse_hub_source_options(source, options, push_to_hub=push_to_hub)
    with fresh_reads(no_cache), checkpoint_source(source) as readable, reading_path(readable, "convert-dcp"):
        run_convert(readable, options, push_to_hub=push_to_hub, private=private, json_out=json_out, quiet=quiet)


def refuse_hub_source_options(
    source: str, options: ConvertOptions, *, push_to_hub: str | None, output_flag: str = "--output"
) -> None:
    """A checkpoint on the Hub is only read: the conversion goes to a local output the user names."""
    if not is_hub_path(source):
        return
    if options.delete_dcp:
        raise UsageError(f"{source}: --delete-dcp deletes local shards; a checkpoint on the Hub is never changed")
    if push_to_hub:
        raise UsageError(f"{source}: convert to a local {output_flag} first, then push that folder")
    if options.output is None:
        raise UsageError(f"{source}: name a local {output_flag} (a checkpoint on the Hub is never written to)")


def run_convert(
    source: Path,
    options: ConvertOptions | None = None,
    *,
    push_to_hub: str | None = None,
    private: bool = False,
    json_out: bool = False,
    quiet: bool = False,
    **keywords: Any,
) -> None:
    """Shared by ``convert-dcp`` and its LeRobot spelling ``lerobot-convert-dcp``: convert as ``options``
    say, then print (``json_out``: the result as JSON; ``quiet`` or ``json_out``: no progress bar).

    ``keywords``: :func:`ckpt_tools.convert.convert_dcp`'s compatibility spelling of ``options``.
    With ``push_to_hub`` (and not a dry run) the work is :func:`ckpt_tools.hub.publish_checkpoint`'s:
    convert and verify, push, then - with ``delete_dcp`` - delete the shards (a refused deletion
    is refused before the conversion and the push, as without the Hub).
    """
    from ckpt_tools.convert import ConvertOptions, convert_dcp

    options = (options or ConvertOptions()).but(**keywords)
    if quiet or json_out:
        options = options.but(progress=False)
    if options.ema and push_to_hub:
        raise UsageError("--ema with --push-to-hub: convert first, then `ckpt-tools push --ema`")
    pushed = None
    with _sigterm_as_interrupt():
        if push_to_hub and not options.dry_run:
            result, pushed = _convert_and_publish(source, options, push_to_hub, private)
        else:
            result = convert_dcp(source, options)
    if json_out:
        payload = result.to_dict()
        if pushed is not None:
            payload["hub"] = pushed.to_dict()
        emit_json(payload)
        return
    _print_result(result, pushed)


def _convert_and_publish(
    source: Path, options: ConvertOptions, repo_id: str, private: bool
) -> tuple[ConvertResult, PushResult]:
    """``--push-to-hub``: :func:`ckpt_tools.hub.publish_checkpoint`, the deletion decided before anything is written."""
    from ckpt_tools.convert import convert_dcp
    from ckpt_tools.hub import publish_checkpoint
    from ckpt_tools.hub.push import HubPushError

    if options.delete_dcp:  # the deletion rule, decided before anything is written or sent
        convert_dcp(source, options.but(dry_run=True, progress=False))
    try:
        published = publish_checkpoint(source, repo_id, private=private, convert=options, repo_id_flag="--push-to-hub")
    except HubPushError as e:
        raise _with_retry(e, repo_id, private, options.delete_dcp) from None
    assert published.conversion is not None
    return published.conversion, published.push


def _with_retry(error: HubPushError, repo_id: str, private: bool, delete_dcp: bool) -> HubPushError:
    """The failed push's line, with the command that retries the push alone (of the converted folder).

    The converted files are kept and verified, so pushing them needs no new conversion; with
    ``--delete-dcp`` the shards still wait for a push that succeeded, which rerunning this
    command does (it keeps the verified output, pushes, then deletes).
    """
    from ckpt_tools.cli.hub import retry_command

    if error.folder is None:  # pragma: no cover - push_to_hub always names it
        return error
    retry = f"retry the push alone with: {retry_command(error.folder, repo_id, private)}"
    if delete_dcp:
        retry += " (or rerun this command: it keeps the verified output, pushes, then deletes the shards)"
    return error.but(retry=retry)


# Signals whose default action ends the process without unwinding: a closed terminal (SIGHUP),
# Ctrl-\ (SIGQUIT), a scheduler's stop (SIGTERM). Each unwinds like Ctrl-C instead.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name))


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """A SIGTERM, SIGHUP or SIGQUIT mid-conversion unwinds like Ctrl-C, so temporary files are removed
    and the lock on the output directory is released."""

    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {}
    try:
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, _raise)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _print_result(result: Any, pushed: Any) -> None:
    plan = result.plan
    dtype = plan.dtype or "as saved"
    kind = "PEFT adapter" if plan.peft else plan.what
    if not plan.files:  # an interrupted --delete-dcp finished: nothing was left to convert
        echo(f"Nothing to convert in {plan.dcp_dir.parent}")
        for note in result.notes:
            echo(f"  note: {note}")
        return
    if result.dry_run:
        echo(f"Dry run - nothing written. Would convert the {kind} in {plan.dcp_dir}")
    else:
        echo(f"Converted the {kind} in {plan.dcp_dir}")
    echo(f"  {plan.tensor_count} tensors, {human_bytes(plan.total_bytes)} of tensor data, dtype {dtype}")
    for f in plan.files:
        echo(
            f"  {'would write' if result.dry_run else 'wrote'} {plan.output_dir / f.name}"
            f"  ({len(f.tensors)} tensors, {human_bytes(f.nbytes)})"
        )
    if plan.index_name:
        echo(f"  {'would write' if result.dry_run else 'wrote'} {plan.output_dir / plan.index_name}")
    if not result.dry_run:
        extra = ", verified" if result.verified else ""
        echo(f"  took {result.seconds:.2f} s{extra}")
    if result.deleted_dcp:
        echo(f"  deleted {plan.dcp_dir}")
    if pushed is not None:
        echo(f"  pushed to {pushed.repo_id}: {pushed.commit_url}")
    for note in result.notes:
        echo(f"  note: {note}")
