"""Is a DCP directory what its ``.metadata`` says it is? One answer for every reader.

torch's DCP loader trusts ``.metadata``: it opens whatever path a storage entry names (``..``,
an absolute path, a symlink out: another run's shard is read as if it were this one's),
leaves elements no chunk covers at whatever the model held before the load, lets overlapping
chunks overwrite each other, and casts a chunk archive of another dtype without a word. So
``inspect``, ``convert-dcp``, the resume prediction and the trainer's resume all check a DCP
directory here first, torch-free, from ``.metadata`` and archive headers, never tensor data:

- storage: every item has a storage entry, without transforms this reader cannot undo (torch's
  zstd extension it undoes, given the ``zstandard`` package: :mod:`ckpt_tools.dcp.transforms`);
- paths: every storage path stays inside the directory and names a regular file that exists;
- spans: every item's span ends inside its file;
- tiling: a tensor's chunks lie inside it, never overlap, and cover every element;
- archives: each chunk's torch.save archive parses and holds the dtype and shape
  ``.metadata`` promises; each non-tensor item is plain data (torch's loader unpickles it).

The checks return :class:`Problem` values; every reader gives the same one line for them,
:func:`summary`: ``inspect`` shows it as its failed check, ``verify-resume`` as its failed
prediction, ``convert-dcp`` and the trainer raise it (:func:`require_valid`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_tools.dcp import transforms
from ckpt_tools.dcp.files import ShardFiles, is_inside
from ckpt_tools.dcp.index import ChunkIndex, TensorEntry
from ckpt_tools.dcp.metadata import BytesMeta, ChunkMeta, TensorMeta
from ckpt_tools.dcp.reader import ChunkLayout, read_chunk_layout, read_pickled_object
from ckpt_tools.dcp.safe_pickle import protocol2_bytes
from ckpt_tools.errors import CheckpointError, CkptError, CorruptCheckpoint, UnsafeCheckpoint
from ckpt_tools.st import dtypes

# What a non-tensor item (optimizer hyper-parameters, say) may be built from: plain data only.
# An OrderedDict pickles as OrderedDict() then SETITEMS: the builtin dict, fresh for each call.
# A bytes value (torchtitan's dataloader state is pickle.dumps output) pickles, at torch.save's
# protocol 2, as _codecs.encode(text, "latin1"): a pure function making new bytes.
PLAIN_OBJECTS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): dict,
    ("_codecs", "encode"): protocol2_bytes,
}
# What a transformed (zstd) span may expand to beyond its tensor bytes: the archive's headers.
ARCHIVE_SLACK = 1 * 2**20
OBJECT_LIMIT = 2 * 2**20  # a non-tensor item's archive (its data.pkl is refused above 1 MiB)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a DCP directory. ``unsafe`` problems are refused, not just reported."""

    message: str
    unsafe: bool = False
    needs: str | None = None  # a package that would let the tools read it (the checkpoint may be fine)

    @classmethod
    def of(cls, error: CkptError) -> Problem:
        return cls(str(error), unsafe=isinstance(error, UnsafeCheckpoint))


def summary(found: list[Problem]) -> str:
    """The one line every reader gives for ``found`` (not empty): the first unsafe problem, else
    the first, and how many more there are. Unsafe first: a shard read from outside the
    checkpoint matters more than a hole a user could patch."""
    first, *rest = sorted(found, key=lambda p: not p.unsafe)
    return first.message + (f" (+{len(rest)} more)" if rest else "")


def summary_error(found: list[Problem]) -> CheckpointError:
    """:func:`summary` as the error a reader raises: unsafe when any problem is."""
    line = summary(found)
    if any(p.unsafe for p in found):
        return UnsafeCheckpoint(line)
    return CheckpointError(line) if all(p.needs for p in found) else CorruptCheckpoint(line)


# ====================================================================== entry points


def require_valid_dir(directory: str | os.PathLike[str]) -> ChunkIndex:
    """Load ``directory``'s index and raise its problems' summary: what a reader does before any byte."""
    index = ChunkIndex.load(directory)
    require_valid(problems(index))
    return index


def require_valid(found: list[Problem]) -> None:
    """Raise :func:`summary_error` of ``found``, if there is anything in it."""
    if found:
        raise summary_error(found)


def problems(index: ChunkIndex) -> list[Problem]:
    """Everything :func:`structure_problems` finds; when that is nothing, the archive check too."""
    return structure_problems(index) or archive_problems(index)


def structure_problems(index: ChunkIndex) -> list[Problem]:
    """What ``.metadata`` and a ``stat`` of each shard file show: storage, paths, spans, tiling."""
    sizes, out = _file_sizes(index)
    return [*_storage_problems(index), *out, *_span_problems(index, sizes), *_tiling(index)]


def archive_problems(index: ChunkIndex) -> list[Problem]:
    """The first chunk archive or non-tensor item that is not what ``.metadata`` promises, if any.

    Sizes alone miss a shard overwritten in place, a chunk re-pointed at another archive or an
    item that would run code when torch's loader unpickles it. Reading the archive headers
    costs a few hundred bytes per chunk. Call it only on an index without structure problems.
    """
    with ShardFiles(index.root) as files:
        for item in index.byte_items.values():
            what = f"{item.file} ({item.fqn})"
            try:
                fd, start, length = files.span(item, limit=OBJECT_LIMIT)
                read_pickled_object(fd, start, length, PLAIN_OBJECTS, what=what)
            except CkptError as e:
                return [Problem.of(e)]
        for entry in index.tensors.values():
            try:
                tensor_layouts(entry, files)
            except CkptError as e:
                return [Problem.of(e)]
    return []


def tensor_layouts(entry: TensorEntry, files: ShardFiles) -> list[ChunkLayout]:
    """Each chunk's archive layout, checked against ``.metadata``; raises on the first mismatch."""
    out = []
    for chunk in entry.chunks:
        what = f"{chunk.file} ({entry.fqn} chunk at {list(chunk.offsets)})"
        itemsize = entry.itemsize or 16
        fd, start, length = files.span(chunk, limit=chunk.numel * itemsize + ARCHIVE_SLACK)
        layout = read_chunk_layout(fd, start, length, what=what)
        if layout.dtype.name != dtypes.canonical_name(entry.dtype) or layout.size != chunk.sizes:
            raise CorruptCheckpoint(
                f"{what}: holds {layout.dtype.name}{list(layout.size)}, .metadata says {entry.dtype}{list(chunk.sizes)}"
            )
        out.append(layout)
    return out


# ====================================================================== storage, paths, spans


def _storage_problems(index: ChunkIndex) -> list[Problem]:
    out = []
    zstd_items = 0
    for fqn, item in index.metadata.items.items():
        keys = [None] if isinstance(item, BytesMeta) else [c.offsets for c in item.chunks]
        for offsets in keys:
            info = index.metadata.storage.get((fqn, offsets))
            if info is None:
                where = "" if offsets is None else f" chunk at {list(offsets)}"
                out.append(Problem(f"{fqn}{where}: no storage entry in .metadata (incomplete save?)"))
            elif info.transform_descriptors:
                problem = transforms.unsupported(info.transform_descriptors)
                if problem:
                    out.append(Problem(f"{fqn}: {problem}"))
                else:
                    zstd_items += 1
    if zstd_items and not transforms.zstd_available():  # one line for the directory, not one per item
        where = f"{index.root} ({zstd_items} items)"
        out.append(Problem(transforms.missing_zstd_message(where), needs=transforms.ZSTD_PACKAGE))
    return out


def _file_sizes(index: ChunkIndex) -> tuple[dict[str, int], list[Problem]]:
    """Size of each referenced shard file that is safe and present; a problem for each other one."""
    sizes: dict[str, int] = {}
    out: list[Problem] = []
    for relative in index.referenced_files():
        size = _shard_size(index.root, relative, out)
        if size is not None:
            sizes[relative] = size
    return sizes, out


def _shard_size(root: Path, relative: str, out: list[Problem]) -> int | None:
    parts = relative.replace("\\", "/").split("/")
    if relative.startswith(("/", "\\")) or os.path.isabs(relative) or ".." in parts or "\x00" in relative:
        out.append(Problem(f"{relative!r}: shard path leaves the checkpoint directory", unsafe=True))
        return None
    path = root / relative
    if not is_inside(root, path):
        out.append(Problem(f"{relative!r}: shard file is a symlink that leads outside the checkpoint", unsafe=True))
        return None
    try:
        st = path.stat()
    except FileNotFoundError:
        out.append(Problem(f"{path}: shard file missing"))
        return None
    except OSError as e:
        out.append(Problem(f"{path}: unreadable ({e.strerror})"))
        return None
    if not path.is_file():
        out.append(Problem(f"{path}: not a regular file"))
        return None
    return st.st_size


def _span_problems(index: ChunkIndex, sizes: dict[str, int]) -> list[Problem]:
    spans = [(e.fqn, c.file, c.offset, c.length) for e in index.tensors.values() for c in e.chunks]
    spans += [(b.fqn, b.file, b.offset, b.length) for b in index.byte_items.values()]
    out = []
    for fqn, file, offset, length in spans:
        size = sizes.get(file)
        if size is not None and offset + length > size:  # no size: the file's problem is reported
            out.append(
                Problem(
                    f"{fqn}: chunk span {offset}+{length} runs past the end of {file} ({size} bytes): truncated file"
                )
            )
    return out


# ====================================================================== tiling


def _tiling(index: ChunkIndex) -> list[Problem]:
    out = []
    for fqn, item in index.metadata.items.items():
        if isinstance(item, TensorMeta):
            out.extend(tiling_problems(fqn, item))
    return out


def tiling_problems(name: str, meta: TensorMeta) -> list[Problem]:
    """Do the chunks ``.metadata`` lists tile the tensor exactly: inside it, no overlap, no hole?"""
    shape = meta.size
    boxes: list[ChunkMeta] = []
    for c in meta.chunks:
        if len(c.offsets) != len(shape) or len(c.sizes) != len(shape):
            return [Problem(f"{name}: a chunk has {len(c.sizes)} dims, the tensor {len(shape)}")]
        if any(o + s > d for o, s, d in zip(c.offsets, c.sizes, shape, strict=True)):
            return [Problem(f"{name}: chunk at {list(c.offsets)} of size {list(c.sizes)} sticks out of {list(shape)}")]
        if c.numel:
            boxes.append(c)
    if _overlap(boxes):
        return [Problem(f"{name}: chunks overlap (unsupported sharding layout or corrupt metadata)")]
    total = sum(c.numel for c in boxes)
    if total != meta.numel:
        return [Problem(f"{name}: chunks cover {total} of {meta.numel} elements (missing chunks)")]
    return []


def _overlap(boxes: list[ChunkMeta]) -> bool:
    if not boxes:
        return False
    ndim = len(boxes[0].sizes)
    if ndim == 0:
        return len(boxes) > 1
    # Sweep along the dim split into the most pieces (dim 0 for FSDP, dim 1 for Shard(1)...):
    # only boxes whose ranges intersect along it need the full test, so it stays ~linear.
    d = max(range(ndim), key=lambda i: len({b.offsets[i] for b in boxes}))
    ordered = sorted(boxes, key=lambda c: c.offsets[d])
    active: list[ChunkMeta] = []
    for box in ordered:
        start = box.offsets[d]
        active = [a for a in active if a.offsets[d] + a.sizes[d] > start]
        for other in active:
            if all(
                o1 < o2 + s2 and o2 < o1 + s1
                for o1, s1, o2, s2 in zip(box.offsets, box.sizes, other.offsets, other.sizes, strict=True)
            ):
                return True
        active.append(box)
    return False
