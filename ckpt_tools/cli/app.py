"""The Typer application object, the error boundary, and the entry point.

Command modules register themselves on :data:`app` when imported; :func:`main` imports them
all. Each command body runs inside :func:`handled`, which turns a :class:`CkptError` into
one line on stderr and the documented exit code - never a traceback.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from ckpt_tools import __version__
from ckpt_tools.cli.untrusted import echo, emit_json
from ckpt_tools.errors import CheckpointError, CkptError, UsageError, shown

__all__ = ["COMMAND_MODULES", "EXIT_CODES_HELP", "app", "emit_json", "fail", "handled", "main"]

# One module per command; each adds itself to ``app`` at import time. Only the invoked
# command's module is imported (start-up time is part of every CI gate's cost).
COMMAND_MODULES: dict[str, str] = {
    "inspect": "ckpt_tools.cli.inspect",
    "convert-dcp": "ckpt_tools.cli.convert",
    "reshard-plan": "ckpt_tools.cli.plan",
    "verify-resume": "ckpt_tools.cli.verify",
    "push": "ckpt_tools.cli.hub",
    "prune": "ckpt_tools.cli.prune",
}

EXIT_CODES_HELP = (
    "Exit codes: 0 fine; 1 checks failed (unhealthy / not resumable); 2 bad usage;"
    " 3 missing, corrupt or unsafe input; 4 output could not be written; 5 Hub upload failed."
)

app = typer.Typer(
    name="ckpt-tools",
    help="Inspect, convert, plan and verify PyTorch DCP / safetensors checkpoints - no torch needed.\n\n"
    + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

F = TypeVar("F", bound=Callable[..., Any])


def _version(value: bool) -> None:
    if value:
        echo(f"ckpt-tools {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", callback=_version, is_eager=True
    ),
) -> None:
    """Checkpoint tools for DDP / FSDP2 / HSDP runs."""


def fail(error: CkptError) -> typer.Exit:
    """Print ``error`` as one line on stderr (what it quotes from files escaped) and return the Exit to raise."""
    echo(f"error: {error}", err=True)
    return typer.Exit(code=int(error.exit_code))


def handled(func: F) -> F:
    """Wrap a command body so user-facing errors become one line and an exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except CkptError as e:
            raise fail(e) from None
        except OSError as e:  # a path the file system refuses (too long, a loop, ...): no reader caught it
            where = e.filename if e.filename is not None else "input"
            raise fail(CheckpointError(f"{shown(str(where))}: {e.strerror or e}")) from None
        except KeyboardInterrupt:
            echo("error: interrupted", err=True)
            raise typer.Exit(code=130) from None

    return wrapper  # type: ignore[return-value]


def main() -> None:
    if "" in sys.argv[1:]:  # Path("") is the current directory: `push ""` would publish whatever is there
        echo("error: an empty argument: name the path (or value) explicitly, e.g. . for this directory", err=True)
        raise SystemExit(int(UsageError.exit_code))
    invoked = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    wanted = [COMMAND_MODULES[invoked]] if invoked in COMMAND_MODULES else list(COMMAND_MODULES.values())
    for name in wanted:
        importlib.import_module(name)
    app()
