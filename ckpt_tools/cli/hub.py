"""``ckpt-tools push``: publish a converted checkpoint as a Hugging Face Hub model repo."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import typer

from ckpt_tools.cli.app import EXIT_CODES_HELP, app, emit_json, handled
from ckpt_tools.cli.options import EmaOpt, JsonOpt
from ckpt_tools.cli.untrusted import echo
from ckpt_tools.errors import UsageError
from ckpt_tools.hub import push_to_hub
from ckpt_tools.hub.files import WEIGHTS, WHOLE_RUN, WHOLE_STEP, ema_publish_folder
from ckpt_tools.hub.push import HubPushError, dry_run, prepare_push
from ckpt_tools.retention.lease import reading_path
from ckpt_tools.units import human_bytes

PUSH_HELP = f"""Publish a checkpoint to the Hugging Face Hub as a model repo.

By default the weights alone: PATH is a converted pretrained_model/ dir, a step dir (its
pretrained_model/ is published), a checkpoints root or the run dir holding it (its `last`
checkpoint) or a `convert-dcp --output` dir, and only its top-level *.safetensors, *.json and
*.md files are uploaded - what loads the policy; never DCP shards, never training_state/,
never hidden files. A checkpoint holding only DCP shards is refused: run `ckpt-tools
convert-dcp` first (or `convert-dcp --push-to-hub REPO`).

--whole-step publishes the step PATH names as the trainer wrote it (pretrained_model/,
training_state/, DCP shards, the record of its files) under checkpoints/<step>/, so a download
resumes with `ckpt-train --resume=true`; --whole-run every complete step and checkpoints/last
(a file holding the step's name: the Hub holds no links).

Local absolute paths in JSON files (train_config.json's dataset.root, output_dir) are published
as null, in copies; local files are never changed. One commit, with a README.md model card
generated from train_config.json unless the folder has its own. --dry-run contacts nothing:
it prints the files (repo path, size, source) and the card as they would be published.

The token comes from HF_TOKEN or the token file of `hf auth login`; it is never printed.
CKPT_TOOLS_HUB_TIMEOUT (seconds, default 120) bounds each read, write and connect;
CKPT_TOOLS_HUB_DEADLINE (seconds, default 300, plus the upload's time at 256 KiB/s) each whole
request; an answer larger than 16 MiB is refused.

\b
Examples:
  ckpt-tools push outputs/train/checkpoints/last --repo-id alice/act-pusht
  ckpt-tools push outputs/train/checkpoints/005000/pretrained_model --repo-id alice/act-pusht --private
  ckpt-tools push converted/ --repo-id alice/act-pusht --revision step-5000 --json
  ckpt-tools push outputs/train/checkpoints/last --repo-id alice/act-pusht-ckpt --whole-step --private
  ckpt-tools push outputs/train --repo-id alice/act-pusht-run --whole-run --dry-run

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
    whole_step: Annotated[
        bool, typer.Option("--whole-step", help="Publish the whole step (resumable) under checkpoints/<step>/.")
    ] = False,
    whole_run: Annotated[
        bool, typer.Option("--whole-run", help="Publish every complete step of the run and checkpoints/last.")
    ] = False,
    dry: Annotated[
        bool,
        typer.Option("--dry-run", help="Contact nothing: print the files and the card as they would be published."),
    ] = False,
    json_out: JsonOpt = False,
    ema: EmaOpt = False,
) -> None:
    if whole_step and whole_run:
        raise UsageError("--whole-step and --whole-run: give one (a run publishes all its steps)")
    scope = WHOLE_STEP if whole_step else WHOLE_RUN if whole_run else WEIGHTS
    if ema:
        if scope is not WEIGHTS:
            raise UsageError("--ema publishes a step's EMA weights as the model: not with --whole-step or --whole-run")
        path = ema_publish_folder(path)  # the step's pretrained_model_ema/, published as the model
    if dry:
        _print_dry_run(
            dry_run(
                prepare_push(
                    path, repo_id, revision=revision, commit_message=commit_message, model_card=not no_card, scope=scope
                )
            ),
            json_out,
        )
        return
    try:
        with reading_path(path, "push"):
            result = push_to_hub(
                path,
                repo_id,
                private=private,
                revision=revision,
                commit_message=commit_message,
                model_card=not no_card,
                scope=scope,
            )
    except HubPushError as e:
        command = retry_command(path, repo_id, private, revision, commit_message, no_card, scope)
        raise e.but(retry=f"retry with: {command}") from None
    if json_out:
        emit_json(result.to_dict())
        return
    echo(
        f"Pushed {len(result.files)} file(s), {human_bytes(result.total_bytes)}, to {result.repo_id}"
        f" ({result.revision}{', private' if result.private else ''}): commit {result.commit_oid[:12]}"
    )
    for f in result.files:
        echo(f"  {f.path:<48} {human_bytes(f.size):>10}{'  (generated model card)' if f.generated else ''}")
    if result.skipped:
        echo(f"  not uploaded: {', '.join(result.skipped)}")
    if result.rewritten:
        echo(f"  published as copies without local paths: {', '.join(result.rewritten)}")
    echo(f"  {result.commit_url}")


def _print_dry_run(plan: dict[str, Any], json_out: bool) -> None:
    """The dry run's report: the files (repo path, size, source), what is left out, then the card."""
    if json_out:
        emit_json(plan)
        return
    echo(
        f"Dry run: would push {len(plan['files'])} file(s), {human_bytes(plan['total_bytes'])}, to"
        f" {plan['repo_id']} ({plan['scope']}); nothing was contacted"
    )
    for f in plan["files"]:
        echo(f"  {f['path']:<48} {human_bytes(f['size']):>10}  {f['source']}")
    if plan["skipped"]:
        echo(f"  not uploaded: {', '.join(plan['skipped'])}")
    for name, copy in plan["rewritten"].items():
        echo(f"--- {name} ({copy['change']}) ---")
        for line in (copy["content"] or "(binary: the DCP metadata pickle, otherwise as saved)").splitlines():
            echo(line)
    if plan["card"] is not None:
        echo("--- README.md (generated model card) ---")
        for line in plan["card"].splitlines():
            echo(line)


def retry_command(
    path: Path,
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    no_card: bool = False,
    scope: str = WEIGHTS,
) -> str:
    """The ``ckpt-tools push`` command line that repeats this push, quoted for a POSIX shell."""
    words = ["ckpt-tools", "push", str(path), "--repo-id", repo_id]
    words += ["--private"] if private else []
    words += ["--revision", revision] if revision is not None else []
    words += ["--commit-message", commit_message] if commit_message is not None else []
    words += ["--no-card"] if no_card else []
    words += [f"--{scope}"] if scope != WEIGHTS else []
    return shlex.join(words)
