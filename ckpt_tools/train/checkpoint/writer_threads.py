"""Failures of torch's DCP writer threads, which ``dcp.save`` itself never reports.

``FileSystemWriter(thread_count=N)`` writes shard files from N-1 extra threads and joins them
without looking at how they ended: a thread that hits a full disk prints a traceback and its
files are simply missing from the results, and ``dcp.save`` returns as if all went well - a
checkpoint that would then be committed with holes. This module catches those exceptions with
a ``threading.excepthook`` (keyed on torch's writer function in the thread name, silencing
the traceback) so that :func:`check_after` can turn them into the save's failure.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ckpt_tools.errors import CheckpointError

_WRITER_FUNCTION = "_write_files_from_queue"  # torch.distributed.checkpoint.filesystem
_failures: list[BaseException] = []
_lock = threading.Lock()
_installed = False


def _install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        previous = threading.excepthook

        def hook(args: threading.ExceptHookArgs) -> None:
            if args.thread is not None and _WRITER_FUNCTION in args.thread.name and args.exc_value is not None:
                with _lock:
                    _failures.append(args.exc_value)
                return
            previous(args)

        threading.excepthook = hook
        _installed = True


@contextmanager
def watched() -> Iterator[None]:
    """Around one ``dcp.save``: raise the first writer-thread failure once it returns.

    An ``OSError`` found in the failure's chain (the root cause under torch's follow-up
    ``RuntimeError`` from the half-written zip record) is raised as itself, so callers can
    say "no space left on device" rather than "unexpected pos"; anything else becomes a
    :class:`CheckpointError`.
    """
    _install()
    with _lock:
        seen = len(_failures)
    yield
    with _lock:
        new = _failures[seen:]
        del _failures[seen:]
    if new:
        cause = root_cause(new[0])
        if isinstance(cause, OSError):
            raise cause
        raise CheckpointError(f"a DCP writer thread failed ({type(cause).__name__}: {str(cause)[:300]})")


def root_cause(error: BaseException) -> BaseException:
    """The first ``OSError`` along the ``__cause__`` / ``__context__`` chain, else ``error``."""
    current: BaseException | None = error
    hops = 0
    while current is not None and hops < 32:
        if isinstance(current, OSError):
            return current
        current = current.__cause__ or current.__context__
        hops += 1
    return error
