"""Is a DCP directory what its ``.metadata`` says it is? One answer for every reader.

torch's DCP loader trusts ``.metadata``: it opens whatever path a storage entry names (``..``,
an absolute path, a symlink out: another run's shard is read as if it were this one's),
leaves elements no chunk covers at whatever the model held before the load, lets overlapping
chunks overwrite each other, and casts a chunk archive of another dtype without a word. So
``inspect``, ``convert-dcp``, the resume prediction and the trainer's resume all check a DCP
directory here first, torch-free, from the chunk table and archive headers, never tensor data:

- storage: every item has a storage entry, without transforms this reader cannot undo (torch's
  zstd extension it undoes, given the ``zstandard`` package: :mod:`ckpt_tools.dcp.transforms`);
- paths: every storage path stays inside the directory and names a regular file that exists;
- spans: every item's span ends inside its file;
- tiling: a tensor's chunks lie inside it, never overlap, and cover every element;
- archives: each chunk's torch.save archive parses and holds the dtype and shape
  ``.metadata`` promises (:mod:`ckpt_tools.dcp.archives`); each non-tensor item is plain data
  (torch's loader unpickles it).

Everything but the archives is computed on the table's columns, in time linear in the chunk
count (a 70B model on 1024 ranks: 2.2 million chunks, about a second). The archives cost a
few microseconds a chunk, and nothing at all while the shard files are unchanged since they
were known good: written by the save that indexed them, or checked by an earlier look
(:meth:`ChunkIndex.archives_known_good`).

The checks return :class:`Problem` values; every reader gives the same one line for them,
:func:`summary`: ``inspect`` shows it as its failed check, ``verify-resume`` as its failed
prediction, ``convert-dcp`` and the trainer raise it (:func:`require_valid`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_tools.dcp import transforms
from ckpt_tools.dcp.archives import ArchiveChecker
from ckpt_tools.dcp.files import ShardFiles, is_inside, listing
from ckpt_tools.dcp.index import ChunkIndex, TensorEntry
from ckpt_tools.dcp.reader import ChunkLayout, read_pickled_object
from ckpt_tools.dcp.safe_pickle import TupleStateRecord, protocol2_bytes
from ckpt_tools.dcp.table import MAX_NUMEL, ChunkTable
from ckpt_tools.errors import CheckpointError, CkptError, CorruptCheckpoint, UnsafeCheckpoint


class BytesIOState(TupleStateRecord):
    """What an ``io.BytesIO`` pickles as - ``BytesIO()``, then its state ``(value, position, __dict__)`` -
    kept as that data, never an open stream.

    Some fp8 and kernel libraries keep a module's extra state (``get_extra_state``) in a
    ``BytesIO``, and torch's state dicts, so DCP, save it as a non-tensor item. Reading the
    state runs no code: refusing it called normal checkpoints unhealthy.
    """

    FIELDS = ("value", "position", "dict")


# What a non-tensor item (optimizer hyper-parameters, say) may be built from: plain data only.
# An OrderedDict pickles as OrderedDict() then SETITEMS: the builtin dict, fresh for each call.
# A bytes value (torchtitan's dataloader state is pickle.dumps output) pickles, at torch.save's
# protocol 2, as _codecs.encode(text, "latin1"): a pure function making new bytes.
PLAIN_OBJECTS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): dict,
    ("_codecs", "encode"): protocol2_bytes,
    ("_io", "BytesIO"): BytesIOState,
}
OBJECT_LIMIT = 2 * 2**20  # a non-tensor item's archive (its data.pkl is refused above 1 MiB)
LISTED = 100  # problems of one kind described one by one; the rest are counted


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a DCP directory. ``unsafe`` problems are refused, not just reported."""

    message: str
    unsafe: bool = False
    needs: str | None = None  # a package that would let the tools read it (the checkpoint may be fine)
    also: int = 0  # further problems of the same kind this one stands for (not listed one by one)

    @classmethod
    def of(cls, error: CkptError) -> Problem:
        return cls(str(error), unsafe=isinstance(error, UnsafeCheckpoint))


def summary(found: list[Problem]) -> str:
    """The one line every reader gives for ``found`` (not empty): the first unsafe problem, else
    the first, and how many more there are. Unsafe first: a shard read from outside the
    checkpoint matters more than a hole a user could patch."""
    first, *rest = sorted(found, key=lambda p: not p.unsafe)
    more = len(rest) + sum(p.also for p in found)
    return first.message + (f" (+{more} more)" if more else "")


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
    """What the table and a ``stat`` of each shard file show: storage, paths, spans, tiling."""
    sizes, out = _file_sizes(index)
    return [*_storage_problems(index), *out, *_span_problems(index, sizes), *tiling_problems(index.table)]


def archive_problems(index: ChunkIndex, *, full: bool = False, objects: bool = True) -> list[Problem]:
    """The first chunk archive or non-tensor item that is not what ``.metadata`` promises, if any.

    Sizes alone miss a shard overwritten in place, a chunk re-pointed at another archive or an
    item that would run code when torch's loader unpickles it. Reading the archive headers
    costs a few hundred bytes per chunk; nothing while the shard files are unchanged since
    their archives were known good (unless ``full``). ``objects=False``: the tensor chunks only
    (convert-dcp decodes the non-tensor items itself, skipping what is not plain data). Call it
    only on an index without structure problems.
    """
    with ShardFiles(index.root) as files:
        for item in index.byte_items.values() if objects else ():
            what = f"{item.file} ({item.fqn})"
            try:
                fd, start, length = files.span(item, limit=OBJECT_LIMIT)
                read_pickled_object(fd, start, length, PLAIN_OBJECTS, what=what)
            except CkptError as e:
                return [Problem.of(e)]
        if not full and index.archives_known_good():
            return []
        try:
            ArchiveChecker(index.table, files).check_rows(np.flatnonzero(index.table.file >= 0))
        except CkptError as e:
            return [Problem.of(e)]
    index.remember_archives_checked()
    return []


def tensor_layouts(entry: TensorEntry, files: ShardFiles, checker: ArchiveChecker | None = None) -> list[ChunkLayout]:
    """Each stored chunk's archive layout, checked against ``.metadata``; raises on the first mismatch.

    Pass one ``checker`` for the tensors of one directory: chunks alike are then compared with
    the first one's headers instead of parsed (:mod:`ckpt_tools.dcp.archives`).
    """
    checker = checker if checker is not None else ArchiveChecker(entry.table, files)
    rows = entry.rows
    return [checker.layout(i, entry.t) for i in range(rows.start, rows.stop) if entry.table.file[i] >= 0]


# ====================================================================== storage, paths, spans


def _storage_problems(index: ChunkIndex) -> list[Problem]:
    tb = index.table
    out: list[Problem] = []
    missing = np.flatnonzero(tb.file < 0)
    for i in missing[:LISTED].tolist():
        t = int(tb.tensor_of_row[i])
        nd = max(int(tb.ndim[i]), 0)
        out.append(
            Problem(
                f"{tb.names[t]} chunk at {tb.offsets[i, :nd].tolist()}: no storage entry in .metadata (incomplete save?)"
            )
        )
    if missing.size > LISTED:
        out[-1] = Problem(out[-1].message, also=int(missing.size) - LISTED)
    for item in tb.byte_items:
        if item.file is None:
            out.append(Problem(f"{item.name}: no storage entry in .metadata (incomplete save?)"))
    zstd_items = 0
    stored = tb.file >= 0
    counts = np.bincount(tb.transform[stored], minlength=len(tb.transforms))
    for tid, descriptors in enumerate(tb.transforms):
        if tid == 0 or not counts[tid]:
            continue
        problem = transforms.unsupported(descriptors)
        if problem:
            first = int(np.flatnonzero(stored & (tb.transform == tid))[0])
            out.append(Problem(f"{tb.names[int(tb.tensor_of_row[first])]}: {problem}", also=int(counts[tid]) - 1))
        else:
            zstd_items += int(counts[tid])
    for item in tb.byte_items:
        if item.file is not None and item.transforms:
            problem = transforms.unsupported(item.transforms)
            if problem:
                out.append(Problem(f"{item.name}: {problem}"))
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
    listed = listing(index.root)
    for relative in index.referenced_files():
        entry = listed.get(relative) if _plain_name(relative) else None
        if entry is not None and entry.regular and not entry.symlink:  # a file right here: inside by construction
            sizes[relative] = entry.size
            continue
        size = _shard_size(index.root, relative, out)
        if size is not None:
            sizes[relative] = size
    return sizes, out


def _plain_name(relative: str) -> bool:
    return relative not in ("", ".", "..") and not any(c in relative for c in "/\\\0")


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
    tb = index.table
    file_size = np.asarray([sizes.get(f, -1) for f in tb.files], dtype=np.int64)
    out = []
    stored = np.flatnonzero(tb.file >= 0)
    if stored.size:
        size = file_size[tb.file[stored]]
        # start + length > size, without overflow: both are at most 2**63 - 1
        past = (size >= 0) & ((tb.start[stored] > size) | (tb.length[stored] > size - tb.start[stored]))
        bad = stored[past]
        tensor_of = tb.tensor_of_row
        for i in bad[:LISTED].tolist():
            out.append(
                _past_end(
                    tb.names[int(tensor_of[i])], tb.files[int(tb.file[i])], int(tb.start[i]), int(tb.length[i]), sizes
                )
            )
        if bad.size > LISTED:
            out[-1] = Problem(out[-1].message, also=int(bad.size) - LISTED)
    for b in tb.byte_items:
        size = sizes.get(b.file) if b.file is not None else None
        if size is not None and b.start + b.length > size:
            out.append(_past_end(b.name, b.file or "", b.start, b.length, sizes))
    return out


def _past_end(fqn: str, file: str, offset: int, length: int, sizes: dict[str, int]) -> Problem:
    return Problem(
        f"{fqn}: chunk span {offset}+{length} runs past the end of {file} ({sizes[file]} bytes): truncated file"
    )


# ====================================================================== tiling


def tiling_problems(tb: ChunkTable) -> list[Problem]:
    """Do each tensor's chunks tile it exactly: inside it, no overlap, no hole? One problem per bad tensor.

    All chunks of ``.metadata`` count, stored or not (a chunk without a storage entry is its
    own problem). Vectorized over the table; only tensors whose chunks are split along two or
    more dimensions at once (tensor and data parallel together) take the exact sweep per tensor.
    """
    n_tensors = len(tb.names)
    if n_tensors == 0:
        return []
    width = tb.width
    t_ndim = np.asarray([len(s) for s in tb.shapes], dtype=np.int64)
    t_shape = np.ones((n_tensors, width), dtype=np.int64)
    for t, shape in enumerate(tb.shapes):
        t_shape[t, : len(shape)] = shape
    numel = [tb.numel(t) for t in range(n_tensors)]
    huge = np.asarray([n > MAX_NUMEL for n in numel], dtype=bool)
    row_t = tb.tensor_of_row
    shape_of_row = t_shape[row_t]
    dims_bad = tb.ndim != t_ndim[row_t]
    outside = ~dims_bad & np.any((tb.sizes > shape_of_row) | (tb.offsets > shape_of_row - tb.sizes), axis=1)
    first_bad = _first_per_tensor(dims_bad | outside, row_t, n_tensors)
    ok_t = (first_bad < 0) & ~huge
    row_ok = ok_t[row_t]
    vol = np.where(row_ok, tb.row_numel(), 0)
    nonempty = row_ok & (vol > 0)
    overlap = _overlaps(tb, t_shape, row_t, nonempty, ok_t)
    running = np.zeros(tb.rows + 1, dtype=np.int64)
    np.cumsum(vol, out=running[1:])
    covered = running[tb.first[1:]] - running[tb.first[:-1]]  # exact: a tensor's sum is at most its numel
    out = []
    for t in range(n_tensors):
        name = tb.names[t]
        if huge[t]:
            out.append(Problem(f"{name}: {list(tb.shapes[t])} holds more elements than any tensor can"))
        elif first_bad[t] >= 0:
            i = int(first_bad[t])
            nd = int(tb.ndim[i])
            if dims_bad[i]:
                dims = nd if nd >= 0 else -1 - nd
                out.append(Problem(f"{name}: a chunk has {dims} dims, the tensor {len(tb.shapes[t])}"))
            else:
                out.append(
                    Problem(
                        f"{name}: chunk at {tb.offsets[i, :nd].tolist()} of size {tb.sizes[i, :nd].tolist()}"
                        f" sticks out of {list(tb.shapes[t])}"
                    )
                )
        elif overlap[t]:
            out.append(Problem(f"{name}: chunks overlap (unsupported sharding layout or corrupt metadata)"))
        elif int(covered[t]) != numel[t]:
            out.append(Problem(f"{name}: chunks cover {int(covered[t])} of {numel[t]} elements (missing chunks)"))
    return out


def _first_per_tensor(bad: np.ndarray, row_t: np.ndarray, n_tensors: int) -> np.ndarray:
    """For each tensor, its first row where ``bad`` holds, or -1."""
    out = np.full(n_tensors, -1, dtype=np.int64)
    rows = np.flatnonzero(bad)
    if rows.size:
        tensors, first = np.unique(row_t[rows], return_index=True)
        out[tensors] = rows[first]
    return out


def _overlaps(
    tb: ChunkTable, t_shape: np.ndarray, row_t: np.ndarray, nonempty: np.ndarray, ok_t: np.ndarray
) -> np.ndarray:
    """Per tensor, whether two of its non-empty chunks (all inside it) overlap."""
    n_tensors = len(tb.names)
    overlap = np.zeros(n_tensors, dtype=bool)
    rows = np.flatnonzero(nonempty)
    if rows.size == 0:
        return overlap
    rt = row_t[rows]
    shape = t_shape[rt]
    offsets, sizes = tb.offsets[rows], tb.sizes[rows]
    # a dim along which a chunk does not span the whole tensor
    split = (offsets != 0) | (sizes != shape)
    bits = (split.astype(np.int64) << np.arange(tb.width, dtype=np.int64)).sum(axis=1)
    mask = np.zeros(n_tensors, dtype=np.int64)
    np.bitwise_or.at(mask, rt, bits)
    count = np.bincount(rt, minlength=n_tensors)
    popcount = np.asarray([bin(int(m)).count("1") for m in mask], dtype=np.int64)
    # no split dim: whole-tensor chunks overlap as soon as there are two
    overlap |= (popcount == 0) & (count > 1)
    # one split dim: intervals along it, sorted by start, overlap iff two neighbours do
    line = popcount[rt] == 1
    if line.any():
        lr = np.flatnonzero(line)
        dim = np.log2(mask[rt[lr]]).astype(np.int64)
        start = offsets[lr, dim]
        end = start + sizes[lr, dim]
        order = np.lexsort((start, rt[lr]))
        t_sorted, s_sorted, e_sorted = rt[lr][order], start[order], end[order]
        same = t_sorted[1:] == t_sorted[:-1]
        hit = same & (s_sorted[1:] < e_sorted[:-1])
        overlap[np.unique(t_sorted[1:][hit])] = True
    # several split dims at once: the exact sweep, tensor by tensor
    for t in np.flatnonzero((popcount > 1) & ok_t).tolist():
        mine = rows[rt == t]
        overlap[t] = _sweep(tb.offsets[mine], tb.sizes[mine])
    return overlap


def _sweep(offsets: np.ndarray, sizes: np.ndarray) -> bool:
    """Whether two of the boxes overlap: sweep along the dim split into the most pieces."""
    boxes = list(zip(offsets.tolist(), sizes.tolist(), strict=True))
    ndim = offsets.shape[1]
    d = max(range(ndim), key=lambda i: len({b[0][i] for b in boxes}))
    ordered = sorted(boxes, key=lambda b: b[0][d])
    active: list[tuple[list[int], list[int]]] = []
    for box in ordered:
        start = box[0][d]
        active = [a for a in active if a[0][d] + a[1][d] > start]
        for other in active:
            if all(
                o1 < o2 + s2 and o2 < o1 + s1 for o1, s1, o2, s2 in zip(box[0], box[1], other[0], other[1], strict=True)
            ):
                return True
        active.append(box)
    return False
