"""Local absolute paths in the JSON files of a push: published as ``null``, never as they are.

A checkpoint's JSON records where things were on the machine that trained:
``train_config.json`` holds ``dataset.root``, ``output_dir`` and a local ``policy.path``;
``adapter_config.json`` may hold a PEFT base model on local disk. Those strings name home
directories and user names (``/home/alice/data/...``, ``/Users/bob/...``, ``C:\\Users\\...``)
and mean nothing on another machine, so a push publishes a rewritten copy of such a file: every
string value that is an absolute local path becomes ``null``, everything else is kept. The
local files are never touched.

Why ``null``: it is what each of those fields holds when nothing was given (LeRobot then finds
a dataset by its ``repo_id`` in the Hugging Face cache, and a resume writes into the run the
checkpoint is in), so the published config stays one the trainer and the tools read; a
resume on another machine passes ``--dataset.root=...`` when the dataset is local there too.
The fields rewritten are named in the model card and, for a published step, in the step's
record of its files (:func:`ckpt_tools.format.rules.save_files.published_copy`), so the
rewritten ``train_config.json`` is recognised as the save's own by ``inspect`` and
``verify-resume`` after a download.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_tools.dcp.published import NotRewritable, relocated_index, relocated_metadata
from ckpt_tools.errors import CheckpointError, CkptError
from ckpt_tools.format import layout
from ckpt_tools.format.rules import save_files
from ckpt_tools.hub.files import PublishFile, PublishPlan
from ckpt_tools.io.local_path import is_local_path
from ckpt_tools.io.safe_read import read_json_file

NEUTRAL = None  # what an absolute local path is published as


@dataclass(frozen=True)
class Neutralized:
    """A JSON file's published form: its bytes, its parsed content and the dotted fields set to null."""

    data: bytes
    content: Any
    fields: tuple[str, ...]


def neutralize_json(path: Path) -> Neutralized | None:
    """The published copy of the JSON file ``path``; None when it holds no local absolute path (published as is).

    Replaced: every string that is an absolute path, and every string that names this
    machine's home directory anywhere in it (``file:///home/alice/...``, ``--root=/home/alice/...``).
    """
    doc = read_json_file(path)
    fields: list[str] = []
    home = str(Path.home())
    published = _replace(doc, "", fields, home + os.sep if len(home) > 1 else None)
    if not fields:
        return None
    indent = _indent_of(path)
    data = (json.dumps(published, indent=indent, ensure_ascii=False) + "\n").encode("utf-8")
    return Neutralized(data, published, tuple(fields))


def local_strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value that is an absolute local path."""
    if isinstance(value, str):
        if is_local_path(value):
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from local_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from local_strings(item)


def _replace(value: Any, dotted: str, fields: list[str], home: str | None) -> Any:
    if isinstance(value, str) and (is_local_path(value) or (home is not None and home in value)):
        fields.append(dotted or "(the whole file)")
        return NEUTRAL
    if isinstance(value, dict):
        return {k: _replace(v, f"{dotted}.{k}" if dotted else str(k), fields, home) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, f"{dotted}[{i}]", fields, home) for i, v in enumerate(value)]
    return value


def _indent_of(path: Path) -> int | None:
    """Keep the file's look: indented like LeRobot's configs (4) when the original is multi-line."""
    with path.open("rb") as f:
        head = f.read(4096)
    match = re.search(rb"\n( +)\S", head)
    return len(match.group(1)) if match else None


def with_published_copies(plan: PublishPlan) -> PublishPlan:
    """``plan`` with every file that holds a local absolute path replaced by its published copy.

    JSON files get their local paths set to null; a DCP directory's ``.metadata`` and
    ``.metadata.index`` their ``checkpoint_id`` made the directory's place in the published run
    (:mod:`ckpt_tools.dcp.published`). A step's ``save_files.json`` is then published as the
    record of those copies (:func:`ckpt_tools.format.rules.save_files.published_copy`): it keeps
    a copy of ``train_config.json``'s content, which would otherwise carry the paths along.
    """
    files = list(plan.files)
    copies: dict[Path, dict[str, tuple[bytes, Any, tuple[str, ...]]]] = {}
    by_name = {f.name: i for i, f in enumerate(files)}

    def publish_copy(i: int, data: bytes, content: Any, fields: tuple[str, ...]) -> None:
        f = files[i]
        files[i] = dataclasses.replace(f, size=len(data), data=data, rewritten=fields)
        step = _step_of(f)
        if step is not None:
            copies.setdefault(step, {})[f.path.relative_to(step).as_posix()] = (data, content, fields)

    for i, f in enumerate(list(files)):
        if f.data is not None or _is_record(f.path):
            continue
        if f.name.endswith(".json"):
            copy = neutralize_json(f.path)
            if copy is not None:
                publish_copy(i, copy.data, copy.content, copy.fields)
        elif f.path.name == layout.DCP_METADATA:
            for j, data, fields in _relocated_dcp(f, files, by_name):
                publish_copy(j, data, None, fields)
    for i, f in enumerate(files):
        step = _step_of(f) if _is_record(f.path) else None
        if step is not None and step in copies:
            record = save_files.published_copy(layout.StepPaths(step), copies[step])
            fields = tuple(sorted(copies[step]))
            files[i] = dataclasses.replace(f, size=len(record), data=record, rewritten=fields)
    return dataclasses.replace(plan, files=tuple(files))


def _relocated_dcp(
    metadata: PublishFile, files: list[PublishFile], by_name: dict[str, int]
) -> list[tuple[int, bytes, tuple[str, ...]]]:
    """The published ``.metadata`` (and its ``.metadata.index``) of a DCP directory, by index in ``files``."""
    published_dir = metadata.name.rsplit("/", 1)[0]
    original = metadata.path.read_bytes()
    try:
        data = relocated_metadata(original, published_dir)
    except NotRewritable as e:
        raise CheckpointError(
            f"{metadata.path}: records the local directory it was saved to in a form ckpt-tools cannot rewrite"
            f" ({e}); refusing to publish that path"
        ) from None
    if data is None:
        return []
    out: list[tuple[int, bytes, tuple[str, ...]]] = [(by_name[metadata.name], data, ("storage_meta.checkpoint_id",))]
    index_name = f"{published_dir}/{layout.DCP_INDEX}"
    if index_name in by_name:
        index = files[by_name[index_name]]
        try:
            rebound = relocated_index(index.path.read_bytes(), data, published_dir, str(index.path))
        except CkptError as e:
            raise CheckpointError(f"{e}; refusing to publish it (it records the local directory)") from None
        out.append((by_name[index_name], rebound, ("checkpoint_id",)))
    return out


def _is_record(path: Path) -> bool:
    return path.name == layout.SAVE_FILES and path.parent.name == layout.TRAINING_STATE_DIR


def _step_of(f: PublishFile) -> Path | None:
    """The local step directory of a file a whole push publishes at ``checkpoints/<step>/<rel>``.

    Read from where the file goes in the repo, not from folder names, so every folder of a
    step (``pretrained_model/``, ``training_state/``, any other the trainer writes) is covered.
    None for a file of a weights push, whose step record is not published.
    """
    parts = f.name.split("/")
    if len(parts) < 3 or parts[0] != layout.CHECKPOINTS_DIR:
        return None
    return f.path.parents[len(parts) - 3]
