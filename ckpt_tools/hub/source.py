"""A checkpoint path from the command line - local, or ``hf://`` on the Hub - as the path the tools read.

One entry for every tool that takes a checkpoint path: a local path is itself; a Hub path
(:mod:`ckpt_tools.hub.location`) is parsed, its repository listed once through the bounded
client of a push (a deadline per request, a cap per answer; ``CKPT_TOOLS_HUB_TIMEOUT`` and
``CKPT_TOOLS_HUB_DEADLINE`` apply), and handed on as a :class:`~ckpt_tools.hub.hubpath.HubPath`
that the readers read by ranges for as long as the ``with`` block lasts.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from ckpt_tools.hub.location import is_hub_path, parse_hub_path


@contextlib.contextmanager
def checkpoint_source(text: str | os.PathLike[str]) -> Iterator[Path]:
    """``text`` as a readable path: a local ``Path``, or a ``HubPath`` while the block runs."""
    if not is_hub_path(text):
        yield Path(text)
        return
    location = parse_hub_path(str(text))
    from ckpt_tools.hub.hubpath import HubPath
    from ckpt_tools.hub.push import _bounded_client, push_bounds  # the push's bounded client: one home
    from ckpt_tools.hub.remote import HubRepo

    with _bounded_client(push_bounds()):
        yield HubPath.of(HubRepo.open(location))
