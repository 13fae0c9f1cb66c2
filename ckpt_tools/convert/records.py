"""The plan and the result of a conversion: what it will write (``--dry-run`` prints it) and what it did."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_tools.convert.delete import Deletion
from ckpt_tools.dcp.index import TensorEntry
from ckpt_tools.st.dtypes import DType
from ckpt_tools.st.writer import TensorToWrite

OPTIMIZER_OUTPUT_STEM = "optimizer_state_flat"


@dataclass(frozen=True)
class PlannedTensor:
    name: str  # the output key
    source: TensorEntry
    src_dtype: DType
    dtype: DType

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.shape

    @property
    def nbytes(self) -> int:
        return self.source.numel * self.dtype.itemsize

    def to_write(self) -> TensorToWrite:
        shape = self.dtype.safetensors_shape(self.shape)
        assert self.dtype.safetensors is not None and shape is not None  # unrepresentable ones are never planned
        return TensorToWrite(self.name, self.dtype.safetensors, shape, self.nbytes)


@dataclass(frozen=True)
class PlannedFile:
    name: str
    tensors: tuple[PlannedTensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


@dataclass(frozen=True)
class ConvertPlan:
    """Everything a conversion will do, computed before anything is written (``--dry-run`` prints it)."""

    dcp_dir: Path
    output_dir: Path
    what: str
    peft: bool
    dtype: str | None  # None: every tensor keeps its saved dtype
    files: tuple[PlannedFile, ...]
    index_name: str | None
    index: dict[str, Any] | None
    metadata: dict[str, str]
    notes: tuple[str, ...] = ()
    selected: str | None = None  # the dotted key path converted ("": the top level), see ckpt_tools.dcp.selection
    left_out: tuple[str, ...] = ()  # training state under it that was not converted
    skipped: tuple[str, ...] = ()  # tensors of a dtype safetensors cannot hold: not in the output

    @property
    def tensor_count(self) -> int:
        return sum(len(f.tensors) for f in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.nbytes for f in self.files)

    @property
    def output_paths(self) -> list[Path]:
        paths = [self.output_dir / f.name for f in self.files]
        if self.index_name:
            paths.append(self.output_dir / self.index_name)
        return paths

    def to_dict(self) -> dict[str, Any]:
        return {
            "dcp_dir": str(self.dcp_dir),
            "output_dir": str(self.output_dir),
            "what": self.what,
            "selected": self.selected,
            "left_out": list(self.left_out),
            "peft": self.peft,
            "dtype": self.dtype or "as saved",
            "tensor_count": self.tensor_count,
            "total_bytes": self.total_bytes,
            "files": [{"name": f.name, "bytes": f.nbytes, "tensors": len(f.tensors)} for f in self.files]
            + ([{"name": self.index_name, "bytes": None, "tensors": 0}] if self.index_name else []),
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class ConvertResult:
    plan: ConvertPlan
    output_files: tuple[Path, ...]
    tensor_count: int
    bytes: int
    dry_run: bool
    verified: bool = False
    deleted_dcp: bool = False
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    deletion: Deletion | None = field(default=None, repr=False, compare=False)  # what deleting the shards needs
    # which files were verified (device, inode, size, mtime): the deletion refuses replaced ones
    identities: tuple[tuple[int, ...], ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "output_files": [str(p) for p in self.output_files],
            "tensor_count": self.tensor_count,
            "bytes": self.bytes,
            "dry_run": self.dry_run,
            "verified": self.verified,
            "deleted_dcp": self.deleted_dcp,
            "seconds": round(self.seconds, 3),
            "plan": self.plan.to_dict(),
            "notes": list(self.notes),
        }
