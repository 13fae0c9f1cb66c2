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
unknown keys. The readers of the stamped JSON records drop or declare the key. The stamps are
read by :mod:`ckpt_tools.facts.save_stamps`.
"""

from __future__ import annotations

from ckpt_tools.format.record import SAVE_ID_KEY

KEY = SAVE_ID_KEY  # "save_id": in a safetensors __metadata__ and at the top level of a JSON record


def problem(rel: str, stamped: str, save_id: str) -> str:
    """The line for a file stamped by another save than the one the record is of."""
    return f"{rel}: stamped by save {stamped[:12]}, the record is of save {save_id[:12]}"
