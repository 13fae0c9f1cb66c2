"""Two DCP directories compared as torch reads them: what differs between a real save and a generated one.

Both ``.metadata`` files are read with torch's own ``FileSystemReader.read_metadata`` and
compared field by field - items and their order, dtypes and the other tensor properties,
sizes, every chunk's box in order, ``planner_data``, every storage entry (index with its hint,
file, offset, length), the version - then the shard files by name and size, and the
``.metadata`` files by size. Only what a save cannot reproduce is left out: ``save_id`` (a
fresh uuid per save) and ``checkpoint_id`` (the directory the save wrote into).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from devtools.scale.files import DCP_SUFFIX
from devtools.scale.metadata import METADATA_FILE


def differences(real: Path, generated: Path, limit: int = 20) -> list[str]:
    """Everything that differs, one line each (at most ``limit``); empty when the two agree."""
    a, b = FileSystemReader(real).read_metadata(), FileSystemReader(generated).read_metadata()
    out: list[str] = []
    out += _items(a.state_dict_metadata, b.state_dict_metadata)
    if a.planner_data != b.planner_data:
        out.append(_first_difference("planner_data", a.planner_data, b.planner_data))
    out += _storage(a.storage_data, b.storage_data)
    if a.version != b.version:
        out.append(f"version: {a.version!r} vs {b.version!r}")
    if type(a.storage_meta.checkpoint_id) is not type(b.storage_meta.checkpoint_id):
        out.append(f"checkpoint_id type: {type(a.storage_meta.checkpoint_id)} vs {type(b.storage_meta.checkpoint_id)}")
    if (a.storage_meta.load_id is None, a.storage_meta.modules) != (False, []) or b.storage_meta.modules != []:
        out.append(f"storage_meta: {a.storage_meta} vs {b.storage_meta}")
    files_a, files_b = _files(real), _files(generated)
    if files_a != files_b:
        out.append(_first_difference("shard files (name: bytes)", files_a, files_b))
    size_a, size_b = (real / METADATA_FILE).stat().st_size, (generated / METADATA_FILE).stat().st_size
    if size_a != size_b:
        out.append(f"{METADATA_FILE}: {size_a} bytes vs {size_b}")
    return out[:limit]


def _items(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    if list(a) != list(b):
        return [_first_difference("items (in order)", list(a), list(b))]
    out = []
    for fqn, x in a.items():
        y = b[fqn]
        if type(x) is not type(y):
            out.append(f"{fqn}: {type(x).__name__} vs {type(y).__name__}")
        elif isinstance(x, TensorStorageMetadata):
            px, py = x.properties, y.properties
            props = [(p.dtype, p.layout, p.requires_grad, p.memory_format, p.pin_memory) for p in (px, py)]
            if props[0] != props[1]:
                out.append(f"{fqn}: properties {props[0]} vs {props[1]}")
            if x.size != y.size:
                out.append(f"{fqn}: size {tuple(x.size)} vs {tuple(y.size)}")
            boxes = [[(tuple(c.offsets), tuple(c.sizes)) for c in t.chunks] for t in (x, y)]
            if boxes[0] != boxes[1]:
                out.append(f"{fqn}: chunks {boxes[0]} vs {boxes[1]}")
    return out


def _storage(a: dict[Any, Any], b: dict[Any, Any]) -> list[str]:
    def table(storage: dict[Any, Any]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        return {
            (i.fqn, None if i.offset is None else tuple(i.offset), i.index): (
                s.relative_path,
                s.offset,
                s.length,
                s.transform_descriptors,
            )
            for i, s in storage.items()
        }

    ta, tb = table(a), table(b)
    if ta == tb:
        return []
    return [_first_difference("storage_data", ta, tb)]


def _files(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.name.endswith(DCP_SUFFIX)}


def _first_difference(what: str, a: Any, b: Any) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        only_a, only_b = [k for k in a if k not in b], [k for k in b if k not in a]
        if only_a or only_b:
            return f"{what}: only in the real save {only_a[:3]}, only in the generated {only_b[:3]}"
        key = next(k for k in a if a[k] != b[k])
        return f"{what}: {key!r}: {a[key]!r} vs {b[key]!r}"
    if isinstance(a, list) and isinstance(b, list):
        i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        return f"{what}: #{i}: {a[i : i + 1]} vs {b[i : i + 1]} ({len(a)} vs {len(b)} in all)"
    return f"{what}: {a!r} vs {b!r}"
