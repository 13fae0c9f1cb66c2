"""The chunk index: for every tensor of a DCP checkpoint, which bytes of which file hold which box.

Built from ``.metadata`` plus a ``stat`` of each shard file, it is what every tool works from
(convert, inspect, reshard-plan). :meth:`ChunkIndex.problems` lists what is wrong with the
checkpoint without reading tensor data: paths that leave the directory, spans past the end of
their file, chunks that overlap, leave holes, or stick out of their tensor, and storage
entries that are missing. Readers call :meth:`ChunkIndex.require_valid`, which raises on the
first problem; ``inspect`` reports them all.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ckpt_tools.dcp.metadata import BytesMeta, DcpMetadata, StorageInfo, TensorMeta, load_metadata
from ckpt_tools.errors import CheckpointError, CorruptCheckpoint, UnsafeCheckpoint
from ckpt_tools.st import dtypes

_RANK_FILE_RE = re.compile(r"^__(\d+)_(\d+)\.distcp$")


@dataclass(frozen=True)
class Chunk:
    """One saved box of a tensor and the span of the file holding its torch.save archive."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str  # relative to the DCP directory
    offset: int
    length: int

    @property
    def numel(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n


@dataclass(frozen=True)
class TensorEntry:
    fqn: str  # DCP's flattened key, e.g. "model.encoder.weight"
    path: tuple[str | int, ...]  # the nested-dict path, e.g. ("model", "encoder.weight")
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[Chunk, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int | None:
        return dtypes.BY_NAME[self.dtype].itemsize if dtypes.is_known(self.dtype) else None

    @property
    def nbytes(self) -> int | None:
        size = self.itemsize
        return None if size is None else size * self.numel


@dataclass(frozen=True)
class BytesEntry:
    """A pickled non-tensor object (optimizer hyper-parameters, say); never loaded unrestricted."""

    fqn: str
    path: tuple[str | int, ...]
    file: str
    offset: int
    length: int


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint. ``unsafe`` problems are refused, not just reported."""

    message: str
    unsafe: bool = False

    def error(self) -> CheckpointError:
        return UnsafeCheckpoint(self.message) if self.unsafe else CorruptCheckpoint(self.message)


@dataclass(frozen=True)
class RankShard:
    """What one saving rank wrote: its ``__{rank}_{n}.distcp`` files, their bytes and chunks."""

    rank: int
    files: tuple[str, ...]
    file_bytes: int
    chunk_bytes: int
    chunks: int


@dataclass
class ChunkIndex:
    root: Path
    metadata: DcpMetadata
    tensors: dict[str, TensorEntry]
    byte_items: dict[str, BytesEntry]
    file_sizes: dict[str, int | None]  # relative path -> size, None when missing or unsafe
    _problems: list[Problem] = field(default_factory=list)

    # ------------------------------------------------------------------ building

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ChunkIndex:
        """Read ``.metadata`` and stat the shard files; raises only if ``.metadata`` is unusable."""
        root = Path(directory)
        if not root.is_dir():
            raise CheckpointError(f"{root}: not a directory")
        meta_path = root / ".metadata"
        if meta_path.is_symlink() and not _inside(root, meta_path):
            raise UnsafeCheckpoint(f"{meta_path}: symlink leads outside the checkpoint directory")
        metadata = load_metadata(root)
        return cls.from_metadata(root, metadata)

    @classmethod
    def from_metadata(cls, root: Path, metadata: DcpMetadata) -> ChunkIndex:
        problems: list[Problem] = []
        tensors: dict[str, TensorEntry] = {}
        byte_items: dict[str, BytesEntry] = {}
        file_sizes: dict[str, int | None] = {}

        def storage(fqn: str, offsets: tuple[int, ...] | None) -> StorageInfo | None:
            info = metadata.storage.get((fqn, offsets))
            if info is None:
                where = "" if offsets is None else f" chunk at {list(offsets)}"
                problems.append(Problem(f"{fqn}{where}: no storage entry in .metadata (incomplete save?)"))
                return None
            if info.transform_descriptors:
                problems.append(
                    Problem(
                        f"{fqn}: stored with transforms {list(info.transform_descriptors)}, which are not supported"
                    )
                )
            if info.relative_path not in file_sizes:
                file_sizes[info.relative_path] = _stat_inside(root, info.relative_path, problems)
            return info

        for fqn, item in metadata.items.items():
            path = metadata.planner_data.get(fqn, (fqn,))
            if isinstance(item, BytesMeta):
                info = storage(fqn, None)
                if info is not None:
                    byte_items[fqn] = BytesEntry(fqn, path, info.relative_path, info.offset, info.length)
                continue
            assert isinstance(item, TensorMeta)
            chunks = []
            for c in item.chunks:
                info = storage(fqn, c.offsets)
                if info is not None:
                    chunks.append(Chunk(c.offsets, c.sizes, info.relative_path, info.offset, info.length))
            tensors[fqn] = TensorEntry(fqn, path, item.dtype, item.size, tuple(chunks))

        index = cls(root, metadata, tensors, byte_items, file_sizes, problems)
        index._problems.extend(index._span_problems())
        for entry in tensors.values():
            index._problems.extend(coverage_problems(entry, metadata.items[entry.fqn]))  # type: ignore[arg-type]
        return index

    # ------------------------------------------------------------------ checks

    def problems(self) -> list[Problem]:
        return list(self._problems)

    def require_valid(self) -> None:
        """Raise the first problem (unsafe ones first): what a reader must do before copying bytes."""
        for p in sorted(self._problems, key=lambda p: not p.unsafe):
            raise p.error()

    def _span_problems(self) -> list[Problem]:
        out = []
        spans: list[tuple[str, str, int, int]] = [
            (e.fqn, c.file, c.offset, c.length) for e in self.tensors.values() for c in e.chunks
        ]
        spans += [(b.fqn, b.file, b.offset, b.length) for b in self.byte_items.values()]
        for fqn, file, offset, length in spans:
            size = self.file_sizes.get(file)
            if size is None:
                continue  # already reported: missing or unsafe file
            if offset + length > size:
                out.append(
                    Problem(
                        f"{fqn}: chunk span {offset}+{length} runs past the end of {file} ({size} bytes): truncated file"
                    )
                )
        return out

    # ------------------------------------------------------------------ views

    def path_of(self, relative: str) -> Path:
        return self.root / relative

    def top_level_keys(self) -> set[str | int]:
        keys = {e.path[0] for e in self.tensors.values() if e.path}
        keys |= {b.path[0] for b in self.byte_items.values() if b.path}
        return keys

    def ranks(self) -> list[RankShard]:
        """Per saving rank, from the ``__{rank}_{n}.distcp`` names torch's writer uses."""
        per_rank: dict[int, dict[str, int]] = defaultdict(dict)
        chunk_bytes: dict[int, int] = defaultdict(int)
        chunk_count: dict[int, int] = defaultdict(int)
        for name, size in self.file_sizes.items():
            m = _RANK_FILE_RE.match(name)
            if m:
                per_rank[int(m.group(1))][name] = size or 0
        for entry in self.tensors.values():
            for c in entry.chunks:
                m = _RANK_FILE_RE.match(c.file)
                if m:
                    chunk_bytes[int(m.group(1))] += c.length
                    chunk_count[int(m.group(1))] += 1
        # Files a rank wrote that hold no chunk (an HSDP replica, say) still count as its output.
        for path in _list_distcp(self.root):
            m = _RANK_FILE_RE.match(path.name)
            if m and path.name not in per_rank[int(m.group(1))]:
                with contextlib.suppress(OSError):
                    per_rank[int(m.group(1))][path.name] = path.stat().st_size
        return [
            RankShard(
                rank=r,
                files=tuple(sorted(files)),
                file_bytes=sum(files.values()),
                chunk_bytes=chunk_bytes[r],
                chunks=chunk_count[r],
            )
            for r, files in sorted(per_rank.items())
        ]

    def unreferenced_files(self) -> list[str]:
        """``.distcp`` files in the directory that ``.metadata`` never mentions."""
        return sorted(p.name for p in _list_distcp(self.root) if p.name not in self.file_sizes)


def coverage_problems(entry: TensorEntry, meta: TensorMeta) -> list[Problem]:
    """Do the chunks tile the tensor exactly: inside it, no overlap, no hole?"""
    name, shape = entry.fqn, entry.shape
    out: list[Problem] = []
    boxes = []
    for c in meta.chunks:
        if len(c.offsets) != len(shape) or len(c.sizes) != len(shape):
            out.append(Problem(f"{name}: a chunk has {len(c.sizes)} dims, the tensor {len(shape)}"))
            return out
        if any(o + s > d for o, s, d in zip(c.offsets, c.sizes, shape, strict=True)):
            out.append(
                Problem(f"{name}: chunk at {list(c.offsets)} of size {list(c.sizes)} sticks out of {list(shape)}")
            )
            return out
        if c.numel:
            boxes.append(c)
    total = sum(c.numel for c in boxes)
    if _overlap(boxes):
        out.append(Problem(f"{name}: chunks overlap (unsupported sharding layout or corrupt metadata)"))
    elif total != entry.numel:
        out.append(Problem(f"{name}: chunks cover {total} of {entry.numel} elements (missing chunks)"))
    return out


def _overlap(boxes: list) -> bool:
    if not boxes:
        return False
    ndim = len(boxes[0].sizes)
    if ndim == 0:
        return len(boxes) > 1
    # Sweep along the dim split into the most pieces (dim 0 for FSDP, dim 1 for Shard(1)...):
    # only boxes whose ranges intersect along it need the full test, so it stays ~linear.
    d = max(range(ndim), key=lambda i: len({b.offsets[i] for b in boxes}))
    ordered = sorted(boxes, key=lambda c: c.offsets[d])
    active: list = []
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


def _inside(root: Path, path: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


def _stat_inside(root: Path, relative: str, problems: list[Problem]) -> int | None:
    """Size of ``root/relative`` if that path is safe and exists; otherwise record why not."""
    parts = relative.replace("\\", "/").split("/")
    if relative.startswith(("/", "\\")) or os.path.isabs(relative) or ".." in parts or "\x00" in relative:
        problems.append(Problem(f"{relative!r}: shard path leaves the checkpoint directory", unsafe=True))
        return None
    path = root / relative
    if not _inside(root, path):
        problems.append(
            Problem(f"{relative!r}: shard file is a symlink that leads outside the checkpoint", unsafe=True)
        )
        return None
    try:
        st = path.stat()
    except FileNotFoundError:
        problems.append(Problem(f"{path}: shard file missing"))
        return None
    except OSError as e:
        problems.append(Problem(f"{path}: unreadable ({e.strerror})"))
        return None
    if not path.is_file():
        problems.append(Problem(f"{path}: not a regular file"))
        return None
    return st.st_size


def _list_distcp(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.name.endswith(".distcp"))
    except OSError:
        return []
