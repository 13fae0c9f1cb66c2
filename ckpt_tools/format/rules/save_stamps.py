"""The save id stamped into the files a save writes, and the line a disagreeing stamp gets.

``save_files.json`` ties a step's files to one save from the outside: sizes and digests. The
stamp ties each file to its save from the inside, wherever the file's format has room for a
string: the ``__metadata__`` of the safetensors files the trainer writes (``model.safetensors``,
``adapter_model.safetensors``, ``rng_state.safetensors``, ``optimizer_state.safetensors``),
a top-level key of the JSON records it writes (``training_step.json``, ``scheduler_state.json``,
``scaler_state.json``), and ``storage_meta.save_id`` of DCP's ``.metadata`` (torch's own field
for it). A file with a stamp of another save is named as such - a more useful line than
"its digest differs" - and a file copied between steps keeps saying where it came from, even
to someone without this project (``safetensors``' metadata, ``torch``'s ``StorageMeta``).

Files a save writes in others' formats (the policy and train configs, the processors, peft's
``adapter_config.json``) carry none: their readers (draccus, LeRobot, peft) refuse or keep
unknown keys. The readers of the stamped JSON records drop or declare the key.
"""

from __future__ import annotations

from pathlib import Path

from ckpt_tools.errors import CkptError
from ckpt_tools.format.record import SAVE_ID_KEY

KEY = SAVE_ID_KEY  # "save_id": in a safetensors __metadata__ and at the top level of a JSON record
_JSON_LIMIT = 2**20  # stamped JSON records are small; a larger one is not looked into


def stamped_id(path: Path) -> str | None:
    """The save id stamped into the file at ``path`` (None: it carries none, or cannot be read)."""
    try:
        if path.suffix == ".safetensors":
            from ckpt_tools.st.header import read_header

            return _string(read_header(path).metadata.get(KEY))
        if path.suffix == ".json" and path.stat().st_size <= _JSON_LIMIT:
            from ckpt_tools.io.safe_read import read_json_file

            doc = read_json_file(path)
            return _string(doc.get(KEY)) if isinstance(doc, dict) else None
    except (CkptError, OSError):
        return None  # damage is reported by the checks that read the file
    return None


def dcp_stamped_id(directory: Path) -> str | None:
    """``storage_meta.save_id`` of a DCP directory's ``.metadata`` (parsed data-only, without torch)."""
    from ckpt_tools.dcp.metadata import parse_metadata_file
    from ckpt_tools.format.layout import DCP_METADATA

    try:
        return parse_metadata_file(directory / DCP_METADATA).save_id
    except (CkptError, OSError):
        return None


def problem(rel: str, stamped: str, save_id: str) -> str:
    """The line for a file stamped by another save than the one the record is of."""
    return f"{rel}: stamped by save {stamped[:12]}, the record is of save {save_id[:12]}"


def _string(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
