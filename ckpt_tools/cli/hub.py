"""``ckpt-tools push``: publish a converted checkpoint as a Hugging Face Hub model repo."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from ckpt_tools.cli.app import EXIT_CODES_HELP, app, emit_json, handled
from ckpt_tools.cli.options import EmaOpt, JsonOpt
from ckpt_tools.hub import push_to_hub
from ckpt_tools.hub.files import ema_publish_folder
from ckpt_tools.hub.push import HubPushError
from ckpt_tools.io.reader_lease import reading_path
from ckpt_tools.units import human_bytes

PUSH_HELP = f"""Publish a converted checkpoint to the Hugging Face Hub as a model repo.

PATH is a converted pretrained_model/ dir, a step dir (its pretrained_model/ is published),
a checkpoints root or the run dir holding it (its `last` checkpoint) or a `convert-dcp --output` dir. Only the top-level
*.safetensors, *.json and *.md files are uploaded - never DCP shards (pytorch_model_fsdp_0/),
never training_state/, never hidden files - in one commit, with a README.md model card generated
from train_config.json unless the folder has its own. A checkpoint holding only DCP shards is
refused: run `ckpt-tools convert-dcp` first.

The token comes from HF_TOKEN or the token file of `hf auth login`; it is never printed.
CKPT_TOOLS_HUB_TIMEOUT (seconds, default 120) bounds each read, write and connect;
CKPT_TOOLS_HUB_DEADLINE (seconds, default 300, plus the upload's time at 256 KiB/s) each whole
request; an answer larger than 16 MiB is refused.

\b
Examples:
  ckpt-tools push outputs/train/checkpoints/last --repo-id alice/act-pusht
  ckpt-tools push outputs/train/checkpoints/005000/pretrained_model --repo-id alice/act-pusht --private
  ckpt-tools push converted/ --repo-id alice/act-pusht --revision step-5000 --json

{EXIT_CODES_HELP}
"""


@app.command("push", help=PUSH_HELP, no_args_is_help=True)
@handled
def push(
    path: Annotated[
        Path, typer.Argument(metavar="PATH", help="pretrained_model/ dir, step dir, checkpoints root or output dir.")
    ],
    repo_id: Annotated[str, typer.Option("--repo-id", help="Hub model repo NAMESPACE/NAME (created if missing).")],
    private: Annotated[bool, typer.Option("--private", help="Create the repo private.")] = False,
    revision: Annotated[str | None, typer.Option("--revision", help="Branch to commit to (created from main).")] = None,
    commit_message: Annotated[str | None, typer.Option("--commit-message", help="Commit message.")] = None,
    no_card: Annotated[bool, typer.Option("--no-card", help="Do not generate a README.md model card.")] = False,
    json_out: JsonOpt = False,
    ema: EmaOpt = False,
) -> None:
    if ema:
        path = ema_publish_folder(path)  # the step's pretrained_model_ema/, published as the model
    try:
        with reading_path(path, "push"):
            result = push_to_hub(
                path,
                repo_id,
                private=private,
                revision=revision,
                commit_message=commit_message,
                model_card=not no_card,
            )
    except HubPushError as e:
        raise e.but(
            retry=f"retry with: {retry_command(path, repo_id, private, revision, commit_message, no_card)}"
        ) from None
    if json_out:
        emit_json(result.to_dict())
        return
    typer.echo(
        f"Pushed {len(result.files)} file(s), {human_bytes(result.total_bytes)}, to {result.repo_id}"
        f" ({result.revision}{', private' if result.private else ''}): commit {result.commit_oid[:12]}"
    )
    for f in result.files:
        typer.echo(f"  {f.path:<48} {human_bytes(f.size):>10}{'  (generated model card)' if f.generated else ''}")
    if result.skipped:
        typer.echo(f"  not uploaded: {', '.join(result.skipped)}")
    typer.echo(f"  {result.commit_url}")


def retry_command(
    path: Path,
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    no_card: bool = False,
) -> str:
    """The ``ckpt-tools push`` command line that repeats this push, quoted for a POSIX shell."""
    words = ["ckpt-tools", "push", str(path), "--repo-id", repo_id]
    words += ["--private"] if private else []
    words += ["--revision", revision] if revision is not None else []
    words += ["--commit-message", commit_message] if commit_message is not None else []
    words += ["--no-card"] if no_card else []
    return shlex.join(words)
