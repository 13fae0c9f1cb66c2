"""The plan of a conversion, computed before a single output byte is written.

Three steps: *select* the tensors (the model or optimizer part of the state dict, by its shape
or ``--key``; PEFT adapters renamed to peft's saved keys), *type* them (the output dtype of
each, skipping with a note those safetensors cannot hold), then *lay out* the files
(``model.safetensors``, ``adapter_model.safetensors``, Hub-style shards with
``--max-shard-size``, or a flat optimizer file) and where they go.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_tools.convert.options import ConvertOptions
from ckpt_tools.convert.records import OPTIMIZER_OUTPUT_STEM, ConvertPlan, PlannedFile, PlannedTensor
from ckpt_tools.convert.source import Source
from ckpt_tools.dcp import casting, selection, validate
from ckpt_tools.dcp.archives import ArchiveChecker
from ckpt_tools.dcp.files import ShardFiles
from ckpt_tools.dcp.index import ChunkIndex, TensorEntry
from ckpt_tools.dcp.reader import ChunkLayout, read_pickled_object
from ckpt_tools.dcp.safe_pickle import plain_data
from ckpt_tools.errors import CheckpointError, CkptError, UsageError
from ckpt_tools.format import layout as L
from ckpt_tools.format import manifest, peft_keys
from ckpt_tools.st import dtypes
from ckpt_tools.st.dtypes import DType
from ckpt_tools.st.writer import plan_shards


class Layouts(Mapping[str, list[ChunkLayout]]):
    """Each planned tensor's chunk layouts, read from the archive headers when first needed.

    A plan (and a dry run) needs none; the writer needs each tensor's just before copying it.
    One :class:`~ckpt_tools.dcp.archives.ArchiveChecker` serves them all, so chunks alike are
    compared with the first one's headers instead of parsed.
    """

    def __init__(self, files: ShardFiles, pieces: dict[str, list[ChunkLayout]] | None) -> None:
        self._files = files
        self._pieces = pieces
        self._entries: dict[str, TensorEntry] = {}
        self._done: dict[str, list[ChunkLayout]] = {}
        self._checker: ArchiveChecker | None = None

    def add(self, entry: TensorEntry) -> None:
        self._entries[entry.fqn] = entry

    def __getitem__(self, fqn: str) -> list[ChunkLayout]:
        found = self._done.get(fqn)
        if found is None:
            if self._pieces is not None:
                found = self._pieces[fqn]
            else:
                entry = self._entries[fqn]
                if self._checker is None:
                    self._checker = ArchiveChecker(entry.table, self._files)
                found = validate.tensor_layouts(entry, self._files, self._checker)
            self._done[fqn] = found
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class _Selected:
    """The tensors chosen, by output key, and what choosing them noted."""

    sel: selection.Selection
    what: str
    names: dict[str, TensorEntry]
    peft: bool
    notes: list[str]


def make_plan(
    index: ChunkIndex, source: Source, files: ShardFiles, options: ConvertOptions
) -> tuple[ConvertPlan, Layouts]:
    """The plan, and the chunk layouts its tensors will be read through."""
    chosen = _select(index, source, options)
    layouts = Layouts(files, source.pieces.layouts() if source.pieces is not None else None)
    planned, skipped = _typed(index, chosen, layouts, options.output_dtype)
    metadata = _metadata(index, chosen, files)
    stem = "adapter_model" if chosen.peft else ("model" if chosen.what == "model" else OPTIMIZER_OUTPUT_STEM)
    output_dir, single_name = _output_location(source, options.output, options.shard_limit, stem)
    shards = plan_shards([t.to_write() for t in planned], options.shard_limit, stem=stem)
    by_name = {t.name: t for t in planned}
    planned_files = tuple(
        PlannedFile(
            single_name if shards.index is None and single_name is not None else name, tuple(by_name[n] for n in names)
        )
        for name, names in shards.files.items()
    )
    out_dtype = options.output_dtype
    plan = ConvertPlan(
        dcp_dir=index.root,
        output_dir=output_dir,
        what=chosen.what,
        peft=chosen.peft,
        dtype=out_dtype.name if out_dtype else None,
        files=planned_files,
        index_name=f"{stem}.safetensors.index.json" if shards.index is not None else None,
        index=shards.index,
        metadata=metadata,
        notes=tuple(chosen.notes),
        selected=selection.dotted(chosen.sel.prefix),
        left_out=tuple(selection.dotted(p) for p in chosen.sel.left_out),
        skipped=skipped,
    )
    return plan, layouts


def _select(index: ChunkIndex, source: Source, options: ConvertOptions) -> _Selected:
    """The tensors under the selected part, by output key (PEFT adapters: peft's saved keys)."""
    notes = list(source.notes)
    sel = selection.select(index, key=options.key, what=source.what, what_given=options.what_given)
    if sel.picked:
        notes.append(sel.picked)
    names = {sel.name(e.path): e for e in index.tensors.values() if sel.contains(e.path)}
    outside = len(index.tensors) - sum(sel.contains(e.path) for e in index.tensors.values())
    if outside:
        notes.append(f"skipped {outside} tensors outside {sel.label}")
    if not names:
        raise CheckpointError(f"{index.root}: no tensors under {sel.label} to convert")
    peft = sel.what == "model" and manifest.is_peft(source.pretrained_model, weight_names=names)
    if peft:
        renamed = {peft_keys.saved_adapter_key(k): v for k, v in names.items()}
        if len(renamed) != len(names):
            raise CheckpointError(f"{index.root}: two adapter keys map to the same saved name")
        names = renamed
        if options.shard_limit is not None:
            raise UsageError("--max-shard-size: PEFT adapters are saved as one adapter_model.safetensors")
    return _Selected(sel, sel.what, names, peft, notes)


def _typed(
    index: ChunkIndex, chosen: _Selected, layouts: Layouts, out_dtype: DType | None
) -> tuple[list[PlannedTensor], tuple[str, ...]]:
    """Each selected tensor with its output dtype, in key order; and those safetensors cannot hold (noted)."""
    planned: list[PlannedTensor] = []
    unrepresentable: dict[str, list[str]] = {}
    for name in sorted(chosen.names):
        entry = chosen.names[name]
        src = dtypes.BY_NAME.get(dtypes.canonical_name(entry.dtype))
        if src is None or not src.representable or src.safetensors_shape(entry.shape) is None:  # skipped, never fatal
            unrepresentable.setdefault(dtypes.canonical_name(entry.dtype), []).append(name)
            continue
        dst = out_dtype if (out_dtype is not None and src.name in casting.CASTABLE) else src
        layouts.add(entry)
        planned.append(PlannedTensor(name, entry, src, dst))
    for dtype_name, skipped in sorted(unrepresentable.items()):
        shown = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
        chosen.notes.append(
            f"skipped {len(skipped)} {dtype_name} tensors ({shown}): safetensors cannot hold {dtype_name}"
        )
    if not planned:
        raise CheckpointError(f"{index.root}: no tensor under {chosen.sel.label} has a dtype safetensors can hold")
    if out_dtype is not None:
        chosen.notes.extend(_kept_dtype_notes(planned, out_dtype))
    return planned, tuple(n for names in unrepresentable.values() for n in names)


def _kept_dtype_notes(planned: list[PlannedTensor], out_dtype: DType) -> list[str]:
    """Under ``--dtype``: which tensors keep their saved dtype, and why."""
    kept = {t.src_dtype for t in planned if t.src_dtype.name not in casting.CASTABLE}
    plain = sorted(d.name for d in kept if not d.floating)
    uncastable = sorted(d.name for d in kept if d.floating)
    notes = []
    if plain:
        notes.append(f"non-float tensors keep their dtype ({', '.join(plain)})")
    if uncastable:  # torch defines no cast from them either
        notes.append(f"{', '.join(uncastable)} tensors keep their dtype: no cast to {out_dtype.name} is defined")
    return notes


def _metadata(index: ChunkIndex, chosen: _Selected, files: ShardFiles) -> dict[str, str]:
    """The output header's metadata: an optimizer's non-tensor items (param_groups...) as JSON."""
    metadata = {"format": "pt"}
    sel = chosen.sel
    if chosen.what == "optimizer":
        objects, skipped = _decode_objects(index, sel, files)
        for key, value in objects.items():  # param_groups, and any non-tensor state entries
            metadata[key] = json.dumps(value, sort_keys=True, allow_nan=True)
        chosen.notes.extend(skipped)
    elif any(sel.contains(b.path) for b in index.byte_items.values()):
        inside = sum(sel.contains(b.path) for b in index.byte_items.values())
        chosen.notes.append(f"skipped {inside} non-tensor items (not weights)")
    return metadata


def _output_location(
    source: Source, output: str | os.PathLike[str] | None, shard_limit: int | None, stem: str
) -> tuple[Path, str | None]:
    if output is None:
        return default_output_dir(source.dcp_dir, source.step), None
    out = Path(output)
    if out.suffix == ".safetensors":
        if shard_limit is not None:
            raise UsageError("--output: give a directory when --max-shard-size may produce several files")
        return out.parent, out.name
    return out, None


def default_output_dir(dcp_dir: Path, step: L.StepPaths | None) -> Path:
    """Where a conversion writes without ``--output``: the save folder that owns the shards.

    accelerate's DCP dirs (``pytorch_model_fsdp_0/``, ``optimizer_0/``) and any DCP dir inside a
    step belong to the folder holding them; a bare DCP dir (torchtitan's ``step-N/``, a
    ``dcp.save(checkpoint_id=...)`` dir) is its own save, and its parent may hold sibling steps
    whose conversions would collide there - so the output goes inside it.
    """
    if step is not None or dcp_dir.name in (L.MODEL_DCP_DIR, L.OPTIMIZER_DCP_DIR):
        return dcp_dir.parent
    return dcp_dir


def _decode_objects(index: ChunkIndex, sel: selection.Selection, files: ShardFiles) -> tuple[dict[str, Any], list[str]]:
    """Non-tensor optimizer items (param_groups...) as plain data, by key under the selection; others skipped, noted."""
    tree: dict[Any, Any] = {}
    skipped: list[str] = []
    depth = len(sel.prefix)
    for item in index.byte_items.values():
        if not sel.contains(item.path):
            continue
        what = f"{item.file} ({item.fqn})"
        try:
            fd, start, length = files.span(item, limit=validate.OBJECT_LIMIT)
            loaded = read_pickled_object(fd, start, length, validate.PLAIN_OBJECTS, what=what)
            value = plain_data(loaded)
        except (CkptError, ValueError) as e:
            skipped.append(f"skipped non-tensor item {item.fqn}: {e}")
            continue
        node = tree
        for part in item.path[depth:-1]:
            node = node.setdefault(part, {})
        node[item.path[-1]] = value
    return {str(k): _listify(v) for k, v in tree.items()}, skipped


def _listify(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    items = {k: _listify(v) for k, v in node.items()}
    if items and all(isinstance(k, int) for k in items) and sorted(items) == list(range(len(items))):
        return [items[i] for i in range(len(items))]
    return {str(k): v for k, v in items.items()}
