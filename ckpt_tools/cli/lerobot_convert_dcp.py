"""``lerobot-convert-dcp``: LeRobot's command name, with LeRobot's ``--flag=value`` spellings verbatim.

    lerobot-convert-dcp --checkpoint_dir=outputs/train/checkpoints/last --delete_dcp=true \\
        --push_to_hub=user/repo

Also ``--output=``, ``--dtype=``, ``--max_shard_size=``, ``--dry_run=true``, ``--what=``,
``--allow_unresumable=true``, ``--overwrite=true``, ``--private=true``, ``--json=true``, ``--quiet=true``. Booleans take
true/false/1/0/yes/no (or no value, meaning true). The flags become the same
:class:`~ckpt_tools.convert.options.ConvertOptions` ``convert-dcp`` builds; everything else is its code.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_tools.cli.untrusted import echo
from ckpt_tools.errors import CkptError, ExitCode

if TYPE_CHECKING:
    from ckpt_tools.convert.options import ConvertOptions

_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}


def _bool(value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        echo(f"error: {message}", err=True)
        raise SystemExit(int(ExitCode.USAGE))


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="lerobot-convert-dcp",
        description="Merge pytorch_model_fsdp_0/ DCP shards into model.safetensors (alias of ckpt-tools convert-dcp).",
        epilog="Example: lerobot-convert-dcp --checkpoint_dir=outputs/train/checkpoints/last --delete_dcp=true",
    )
    p.add_argument(
        "--checkpoint_dir",
        "--checkpoint-dir",
        required=True,
        help="step dir or its pretrained_model/; local or hf://OWNER/REPO[@REV][/PATH]",
    )
    p.add_argument("--output", default=None, help="output directory (default: next to the shards)")
    p.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: as saved)")
    p.add_argument("--max_shard_size", "--max-shard-size", default=None, help="e.g. 2GB")
    p.add_argument("--what", default=None, choices=["model", "optimizer"], help="what to convert (default: model)")
    p.add_argument("--push_to_hub", "--push-to-hub", default=None, metavar="REPO", help="publish to this Hub repo")
    booleans = {
        "delete_dcp": "delete the DCP shards after the output is written and verified",
        "allow_unresumable": "with --delete_dcp: delete even when what remains no longer resumes bit-exactly",
        "dry_run": "print the plan, write nothing",
        "overwrite": "replace existing output files",
        "private": "with --push_to_hub: create the repo private",
        "json": "print the result as JSON",
        "quiet": "no progress bar",
        "ema": "convert the EMA weights (pretrained_model_ema/) instead of the live ones",
    }
    for flag, text in booleans.items():
        names = dict.fromkeys([f"--{flag}", f"--{flag.replace('_', '-')}"])
        p.add_argument(*names, dest=flag, type=_bool, nargs="?", const=True, default=False, metavar="BOOL", help=text)
    return p


def convert_dcp_main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from ckpt_tools.cli.convert import refuse_hub_source_options, run_convert
    from ckpt_tools.hub.source import checkpoint_source

    try:
        options = options_of(args)
        refuse_hub_source_options(args.checkpoint_dir, options, push_to_hub=args.push_to_hub)
        with checkpoint_source(args.checkpoint_dir) as readable:
            run_convert(
                readable,
                options,
                push_to_hub=args.push_to_hub,
                private=args.private,
                json_out=args.json,
                quiet=args.quiet,
            )
    except CkptError as e:
        echo(f"error: {e}", err=True)
        raise SystemExit(int(e.exit_code)) from None
    except KeyboardInterrupt:
        echo("error: interrupted", err=True)
        raise SystemExit(130) from None


def options_of(args: argparse.Namespace) -> ConvertOptions:
    """LeRobot's flags as convert-dcp's options: each flag's ``dest`` is the option's name.

    The rest (``checkpoint_dir``, ``push_to_hub``, ``private``, ``json``, ``quiet``) is how to run
    and print, as for ``convert-dcp``.
    """
    from ckpt_tools.convert.options import ConvertOptions

    given = {f.name: getattr(args, f.name) for f in fields(ConvertOptions) if hasattr(args, f.name)}
    return ConvertOptions(**{**given, "output": Path(args.output) if args.output else None})


if __name__ == "__main__":
    convert_dcp_main()
