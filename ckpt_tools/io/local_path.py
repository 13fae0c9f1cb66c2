"""Whether a string names an absolute path on some machine, rather than a Hub id or a relative name.

Its own module: a push publishes such strings as null (:mod:`ckpt_tools.hub.local_paths`), and
the DCP rewriter (:mod:`ckpt_tools.dcp.published`) and the model card ask the same question.
"""

from __future__ import annotations

import re

_DRIVE_RE = re.compile(r"^[A-Za-z]:[\\/]")


def is_local_path(value: str) -> bool:
    """An absolute path on some machine (POSIX, home-relative, Windows drive or UNC), not a Hub id."""
    return len(value) > 1 and (value.startswith(("/", "~", "\\")) or bool(_DRIVE_RE.match(value)))
