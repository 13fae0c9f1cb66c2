"""The chunk index: for every tensor of a DCP checkpoint, which bytes of which file hold which box.

Built from ``.metadata`` alone, it is what every tool works from (convert, inspect,
reshard-plan, verify-resume) and what the trainer checks before torch's loader runs. It
describes; it does not judge: whether the paths, spans, boxes and archives it lists are
sound is decided in :mod:`ckpt_tools.dcp.validate`, once for every reader.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ckpt_tools.dcp.files import is_inside
from ckpt_tools.dcp.metadata import BytesMeta, DcpMetadata, TensorMeta, load_metadata
from ckpt_tools.errors import CheckpointError
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
    transforms: tuple[str, ...] = ()  # torch's stream transforms (zstd) applied to the span

    @property
    def numel(self) -> int:
        return dtypes.numel(self.sizes)


@dataclass(frozen=True)
class TensorEntry:
    fqn: str  # DCP's flattened key, e.g. "model.encoder.weight"
    path: tuple[str | int, ...]  # the nested-dict path, e.g. ("model", "encoder.weight")
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[Chunk, ...]

    @property
    def numel(self) -> int:
        return dtypes.numel(self.shape)

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
    transforms: tuple[str, ...] = ()


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
    tensors: dict[str, TensorEntry]  # chunks without a storage entry are left out (validate reports them)
    byte_items: dict[str, BytesEntry]

    # ------------------------------------------------------------------ building

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ChunkIndex:
        """Read ``.metadata``; raises only if it is unusable (or a symlink out of the directory)."""
        root = Path(directory)
        if not root.is_dir():
            raise CheckpointError(f"{root}: not a directory")
        metadata = load_metadata(root)
        return cls.from_metadata(root, metadata)

    @classmethod
    def from_metadata(cls, root: Path, metadata: DcpMetadata) -> ChunkIndex:
        tensors: dict[str, TensorEntry] = {}
        byte_items: dict[str, BytesEntry] = {}
        for fqn, item in metadata.items.items():
            path = metadata.planner_data.get(fqn, (fqn,))
            if isinstance(item, BytesMeta):
                info = metadata.storage.get((fqn, None))
                if info is not None:
                    byte_items[fqn] = BytesEntry(
                        fqn, path, info.relative_path, info.offset, info.length, info.transform_descriptors
                    )
                continue
            assert isinstance(item, TensorMeta)
            chunks = []
            for c in item.chunks:
                info = metadata.storage.get((fqn, c.offsets))
                if info is not None:
                    chunks.append(
                        Chunk(
                            c.offsets, c.sizes, info.relative_path, info.offset, info.length, info.transform_descriptors
                        )
                    )
            tensors[fqn] = TensorEntry(fqn, path, item.dtype, item.size, tuple(chunks))
        return cls(root, metadata, tensors, byte_items)

    # ------------------------------------------------------------------ views

    def referenced_files(self) -> list[str]:
        """Every storage path the items name, in the order ``.metadata`` first names them."""
        files = [c.file for e in self.tensors.values() for c in e.chunks]
        files += [b.file for b in self.byte_items.values()]
        return list(dict.fromkeys(files))

    def top_level_keys(self) -> set[str | int]:
        keys = {e.path[0] for e in self.tensors.values() if e.path}
        keys |= {b.path[0] for b in self.byte_items.values() if b.path}
        return keys

    def ranks(self) -> list[RankShard]:
        """Per saving rank, from the ``__{rank}_{n}.distcp`` names torch's writer uses.

        Files a rank wrote that hold no chunk (an HSDP replica, say) still count as its output;
        a named file that is missing, or a symlink out of the directory, counts 0 bytes.
        """
        present = {p.name: p for p in _list_distcp(self.root)}
        per_rank: dict[int, dict[str, int]] = defaultdict(dict)
        chunk_bytes: dict[int, int] = defaultdict(int)
        chunk_count: dict[int, int] = defaultdict(int)
        for name in [*self.referenced_files(), *present]:
            m = _RANK_FILE_RE.match(name)
            if m and name not in per_rank[int(m.group(1))]:
                per_rank[int(m.group(1))][name] = _size_inside(self.root, present.get(name))
        for entry in self.tensors.values():
            for c in entry.chunks:
                m = _RANK_FILE_RE.match(c.file)
                if m:
                    chunk_bytes[int(m.group(1))] += c.length
                    chunk_count[int(m.group(1))] += 1
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
        referenced = set(self.referenced_files())
        return sorted(p.name for p in _list_distcp(self.root) if p.name not in referenced)


def _size_inside(root: Path, path: Path | None) -> int:
    if path is None or not is_inside(root, path):
        return 0
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _list_distcp(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.name.endswith(".distcp"))
    except OSError:
        return []
