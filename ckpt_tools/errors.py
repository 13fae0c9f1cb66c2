"""Exceptions whose messages are written for the person at the terminal.

Every failure a user can cause (a bad flag, a broken or hostile checkpoint, a full disk)
is raised as a :class:`CkptError` subclass carrying one line that says what is wrong and,
where it helps, what to do. The CLIs print that line and exit with the class's code; they
never show a traceback for these. Anything else escaping is a bug in ckpt_tools.
"""

from __future__ import annotations

from collections.abc import Sized
from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes shared by every command (documented in docs/reliability.md and --help)."""

    OK = 0
    CHECK_FAILED = 1  # the command ran, and its verdict is "no" (unhealthy, not resumable)
    USAGE = 2  # bad flags or option values (also what Typer/click use)
    BAD_INPUT = 3  # the input is missing, incomplete, corrupt, or unsafe to read
    WRITE_FAILED = 4  # the output could not be written (disk full, permissions); inputs untouched
    HUB_FAILED = 5  # the Hugging Face Hub (or the network to it) failed a push; the line says what was written locally
    PEER_LOST = 6  # training: another rank died or stalled past --collective_timeout_s
    NON_FINITE = 7  # training: the loss, the gradients or the weights became NaN or infinite


class CkptError(Exception):
    """Base class: ``str(error)`` is the single line shown to the user."""

    exit_code: ExitCode = ExitCode.BAD_INPUT


class UsageError(CkptError):
    """A flag or option value that cannot work; the message names the flag."""

    exit_code = ExitCode.USAGE


class ConfigError(UsageError):
    """A training configuration refused at start-up (bad flag, bad combination, bad env)."""


class CheckpointError(CkptError):
    """A checkpoint (or part of one) that is missing, incomplete or inconsistent."""

    exit_code = ExitCode.BAD_INPUT


class CorruptCheckpoint(CheckpointError):
    """Bytes on disk that do not match what the metadata promises."""


class UnsafeCheckpoint(CheckpointError):
    """A file that tries to do something a checkpoint must never do (run code, escape its dir)."""


class LegacyCheckpoint(CheckpointError):
    """A 0.6.x-era sharded checkpoint: its weights load, its training state cannot resume."""


class WriteError(CkptError):
    """Writing the output failed; nothing partial was left behind and the inputs are intact."""

    exit_code = ExitCode.WRITE_FAILED


class HubError(CkptError):
    """A Hub operation failed on the Hub's side or the network's; a retry is safe.

    Only for failures that are not ours: a local file that cannot be read or a full local disk
    during a push is a :class:`CheckpointError` or :class:`WriteError`. A push changes no local
    file, but a conversion before it may have written some: the line says which.
    """

    exit_code = ExitCode.HUB_FAILED


class PeerLost(CkptError):
    """Training: a collective failed because another rank died or stopped answering."""

    exit_code = ExitCode.PEER_LOST


class NonFiniteError(CkptError):
    """Training: a loss, a gradient norm or the state to be saved holds NaN or infinite values.

    Nothing of it was committed: ``last`` still points at the previous checkpoint.
    """

    exit_code = ExitCode.NON_FINITE


def shown(value: object, limit: int = 80) -> str:
    """``value`` as a message may show it: at most about ``limit`` characters, whatever its size.

    For values read from a checkpoint. ``repr`` is no way to show them: a few hundred pickle
    bytes can share one list until it has 2**60 leaves (``repr`` never returns), and a name
    of a megabyte would be pasted whole into the line. Strings and bytes are cut before they
    are quoted, integers beyond 64 bits and containers are described, never rendered, and
    anything else is named by its type.
    """
    kind = type(value)
    if value is None or kind is bool or kind is float:
        return repr(value)
    if isinstance(value, int) and kind is int:
        return repr(value) if value.bit_length() <= 64 else f"an integer of {value.bit_length()} bits"
    if isinstance(value, (str, bytes)) and (kind is str or kind is bytes):
        text = repr(value[:limit])
        return text + "..." if len(value) > limit else text
    if isinstance(value, Sized) and kind in (list, tuple, dict, set, frozenset):
        return f"a {kind.__name__} of {len(value)} items"
    return f"a {kind.__name__}"
