"""Import the trainer with the garbage collector paused, then freeze what the imports built.

Importing torch, DCP and torch's compiler stack (``torch.optim`` imports ``torch._dynamo`` on
its first use) creates about half a million long-lived objects: modules, functions, classes.
With the collector running, every full collection during the imports walks all of them again,
and so does every full collection after them (teardown's two included). None of it is garbage,
so the imports run with collection paused and ``gc.freeze`` then moves what they built out of
the collector's view: later collections walk only what was made after start-up, and garbage
made then (a model, a checkpoint's buffers) is collected as before. docs/benchmarks.md has the
start-up measured both ways (bin/bench-startup).
"""

from __future__ import annotations

import gc
import importlib

# Imported here rather than on first use, so that they are part of the frozen heap.
STARTUP_MODULES = (
    "torch",
    "torch._dynamo",  # torch.optim's step and add_param_group import it on their first call
    "ckpt_tools.train.loop",
    "ckpt_tools.train.parallel.distributed",
)


def pause_collection() -> None:
    """Stop automatic collection until :func:`freeze_startup_imports` (call first thing in main)."""
    gc.disable()


def freeze_startup_imports() -> None:
    """Import what every training process imports, freeze it, and collect automatically again."""
    for name in STARTUP_MODULES:
        importlib.import_module(name)
    gc.freeze()
    gc.enable()


def resume_collection() -> None:
    """Collect automatically again (idempotent), also when start-up ended early in a refusal."""
    gc.enable()
