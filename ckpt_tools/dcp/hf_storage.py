"""torch's Hugging Face storage layout (``torch.distributed.checkpoint.hf_storage``), read as DCP pieces.

torch's ``HuggingFaceStorageWriter`` (torch >= 2.8) saves DCP into plain safetensors files and
no ``.metadata``. Each file it writes carries, in its header's ``__metadata__``,
``DCP_SHARDING_INFO``: a JSON object ``{fqn: {"saved_offsets": [...]}}`` saying where each
tensor in the file sits in the whole tensor (``DCP_VERSION`` ``"1.0"`` next to it). It comes
in three forms:

- rank 0 saving full tensors (``save_distributed=False``): ``model-0000i-of-0000n.safetensors``
  plus ``model.safetensors.index.json``; every offset is 0 - whole tensors, loadable as they are;
- every rank saving its own pieces (``save_distributed=True``):
  ``shard-0000r-model-0000i-of-0000n.safetensors`` per rank, no index: a ``[3, 5]`` entry at
  offsets ``[3, 0]`` is rows 3..5 of a larger tensor;
- ``enable_consolidation=True``: those pieces in ``sharded/`` and torch's merged files (no
  ``__metadata__``) plus the index next to it.

A whole tensor's size is not written anywhere: torch's reader takes, per dim, the largest
``offset + size`` over the tensor's pieces, and so does :func:`load`. The pieces become a
:class:`~ckpt_tools.dcp.index.ChunkIndex` whose chunks are the header entries, so the checks
every DCP reader runs (:mod:`ckpt_tools.dcp.validate`: files inside the folder, spans inside
their files, pieces tiling each tensor) and convert-dcp's merge (:mod:`ckpt_tools.dcp.assemble`)
apply unchanged; each piece's bytes are a plain little-endian row-major run at a known offset.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.dcp.reader import ChunkLayout
from ckpt_tools.dcp.table import TableBuilder, TableError
from ckpt_tools.errors import CheckpointError, CorruptCheckpoint
from ckpt_tools.format.layout import SAFETENSORS_SUFFIX
from ckpt_tools.io.remote import as_path
from ckpt_tools.io.safe_read import parse_json
from ckpt_tools.st import dtypes
from ckpt_tools.st.header import SafetensorsHeader, read_header

SHARDING_INFO_KEY = "DCP_SHARDING_INFO"  # torch's _hf_utils.CUSTOM_METADATA_KEY
SAVED_OFFSETS_KEY = "saved_offsets"
VERSION_KEY = "DCP_VERSION"
SHARDED_DIR = "sharded"  # where enable_consolidation leaves the pieces


@dataclass(frozen=True)
class Piece:
    """One header entry of one file: a box of a (perhaps larger) tensor."""

    name: str
    file: str  # relative to the folder
    dtype: str  # safetensors code
    shape: tuple[int, ...]
    offsets: tuple[int, ...]
    data_offset: int  # absolute, in the file
    nbytes: int

    @property
    def whole_if_alone(self) -> bool:
        return not any(self.offsets)


@dataclass
class HfStorage:
    """The safetensors files of one folder, with torch's sharding info where their headers carry it."""

    root: Path
    headers: list[SafetensorsHeader]
    pieces: dict[str, list[Piece]]  # fqn -> its pieces, in file order
    sharding_info: bool  # some header carries DCP_SHARDING_INFO (written by torch's HF storage writer)
    problems: list[str] = field(default_factory=list)  # sharding info that does not fit (headers list their own)

    def all_problems(self) -> list[str]:
        return [m for h in self.headers for m in h.problems] + self.problems

    @property
    def needs_merge(self) -> bool:
        """Whether some tensor is saved in pieces (more than one, or one not at the origin)."""
        return any(len(p) > 1 or not p[0].whole_if_alone for p in self.pieces.values())

    def size(self, fqn: str) -> tuple[int, ...]:
        """The whole tensor's size as torch's reader infers it: per dim, the largest ``offset + size``."""
        pieces = self.pieces[fqn]
        return tuple(max(p.offsets[d] + p.shape[d] for p in pieces) for d in range(len(pieces[0].shape)))

    def to_index(self) -> ChunkIndex:
        """The pieces as DCP chunks (one per header entry), to be checked and merged like any DCP save."""
        b = TableBuilder()
        for fqn, pieces in self.pieces.items():
            t = b.tensor(fqn, dtypes.BY_SAFETENSORS[pieces[0].dtype].name, self.size(fqn))
            for p in pieces:
                b.chunk(t, p.offsets, p.shape)
                b.storage(fqn, p.offsets, p.file, p.data_offset, p.nbytes, 0)
        try:
            table = b.build()
        except TableError as e:
            raise CorruptCheckpoint(f"{self.root}: {e}") from None
        return ChunkIndex.from_table(self.root, table)

    def layouts(self) -> dict[str, list[ChunkLayout]]:
        """Each tensor's piece layouts, in :meth:`to_index`'s chunk order: contiguous little-endian runs."""
        out = {}
        for fqn, pieces in self.pieces.items():
            out[fqn] = [
                ChunkLayout(dtypes.BY_SAFETENSORS[p.dtype], p.shape, _row_major(p.shape), p.data_offset, "little")
                for p in pieces
            ]
        return out


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def safetensors_files(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.name.endswith(SAFETENSORS_SUFFIX) and p.is_file())
    except OSError as e:
        raise CheckpointError(f"{folder}: unreadable ({e.strerror})") from None


def load(folder: str | os.PathLike[str]) -> HfStorage:
    """Read every ``*.safetensors`` header of ``folder``: its tensors, as pieces where torch's sharding info says so.

    Raises :class:`CheckpointError` for an unreadable file; sharding info that does not fit its
    entries is listed in ``problems`` (header problems in each header's).
    """
    root = as_path(folder)
    headers: list[SafetensorsHeader] = []
    pieces: dict[str, list[Piece]] = {}
    problems: list[str] = []
    sharded = False
    seen: set[tuple[str, tuple[int, ...]]] = set()
    for path in safetensors_files(root):
        header = read_header(path)
        headers.append(header)
        info = _sharding_info(header, problems)
        sharded = sharded or info is not None
        for name, entry in header.entries.items():
            dtype = dtypes.BY_SAFETENSORS.get(entry.dtype)
            shape = dtype.torch_shape(entry.shape) if dtype is not None else None
            if shape is None:
                continue  # reported in header.problems
            offsets = _offsets(info, name, len(shape), path.name, problems)
            if offsets is None:
                continue
            if (name, offsets) in seen:
                problems.append(f"{path.name}: {name} at {list(offsets)} is saved twice in {root}")
                continue
            seen.add((name, offsets))
            piece = Piece(name, path.name, entry.dtype, shape, offsets, header.data_start + entry.begin, entry.nbytes)
            known = pieces.setdefault(name, [])
            if known and (known[0].dtype, len(known[0].shape)) != (piece.dtype, len(piece.shape)):
                problems.append(
                    f"{path.name}: {name} is {entry.dtype}{list(shape)}, {known[0].file} says {known[0].dtype}"
                )
                continue
            known.append(piece)
    return HfStorage(root, headers, pieces, sharded, problems)


def _sharding_info(header: SafetensorsHeader, problems: list[str]) -> dict[str, Any] | None:
    raw = header.metadata.get(SHARDING_INFO_KEY)
    if raw is None:
        return None
    try:
        info = parse_json(raw)
    except ValueError as e:
        problems.append(f"{header.path.name}: {SHARDING_INFO_KEY} is not valid JSON ({e})")
        return {}
    if not isinstance(info, dict):
        problems.append(f"{header.path.name}: {SHARDING_INFO_KEY} is not a JSON object")
        return {}
    return info


def _offsets(
    info: dict[str, Any] | None, name: str, ndim: int, file: str, problems: list[str]
) -> tuple[int, ...] | None:
    if info is None:
        return (0,) * ndim
    entry = info.get(name)
    offsets = entry.get(SAVED_OFFSETS_KEY) if isinstance(entry, dict) else None
    if not (
        isinstance(offsets, list)
        and len(offsets) == ndim
        and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
    ):
        problems.append(f"{file}: {name} has no valid {SAVED_OFFSETS_KEY} in {SHARDING_INFO_KEY}")
        return None
    return tuple(offsets)


def require_sound(store: HfStorage) -> None:
    """Raise the first header or sharding-info problem in one line (what convert-dcp does before any byte)."""
    found = store.all_problems()
    if found:
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        raise CorruptCheckpoint(found[0] + more)
