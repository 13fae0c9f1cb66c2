"""The save id stamped into a step's files, read for :mod:`ckpt_tools.format.rules.save_stamps`.

A safetensors file's ``__metadata__``, a JSON record's top-level key, a DCP ``.metadata``'s
``storage_meta.save_id`` (parsed data-only, without torch). An unreadable file gives None:
damage is reported by the checks that read the file.
"""

from __future__ import annotations

from pathlib import Path

from ckpt_tools.dcp.metadata import parse_metadata_file
from ckpt_tools.errors import CkptError
from ckpt_tools.format.layout import DCP_METADATA
from ckpt_tools.format.rules.save_stamps import KEY
from ckpt_tools.io.safe_read import read_json_file
from ckpt_tools.st.header import read_header

_JSON_LIMIT = 2**20  # stamped JSON records are small; a larger one is not looked into


def stamped_id(path: Path) -> str | None:
    """The save id stamped into the file at ``path`` (None: it carries none, or cannot be read)."""
    try:
        if path.suffix == ".safetensors":
            return _string(read_header(path).metadata.get(KEY))
        if path.suffix == ".json" and path.stat().st_size <= _JSON_LIMIT:
            doc = read_json_file(path)
            return _string(doc.get(KEY)) if isinstance(doc, dict) else None
    except (CkptError, OSError):
        return None  # damage is reported by the checks that read the file
    return None


def dcp_stamped_id(directory: Path) -> str | None:
    """``storage_meta.save_id`` of a DCP directory's ``.metadata`` (parsed data-only, without torch)."""
    try:
        return parse_metadata_file(directory / DCP_METADATA).save_id
    except (CkptError, OSError):
        return None


def _string(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
