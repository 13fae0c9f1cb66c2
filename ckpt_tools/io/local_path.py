"""Whether a string is an absolute path on some machine: the one test of the push and the DCP rewriter.

A push publishes such strings as ``null`` (:mod:`ckpt_tools.hub.local_paths`), in JSON files and
in DCP metadata alike (:mod:`ckpt_tools.dcp.published`); a Hub id (``user/repo``) is none.
"""

from __future__ import annotations

import re

_DRIVE_RE = re.compile(r"^[A-Za-z]:[\\/]")


def is_local_path(value: str) -> bool:
    """An absolute path on some machine (POSIX, home-relative, Windows drive or UNC), not a Hub id."""
    return len(value) > 1 and (value.startswith(("/", "~", "\\")) or bool(_DRIVE_RE.match(value)))
