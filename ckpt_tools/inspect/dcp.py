"""A DCP directory as ``inspect`` reports it: its ``.metadata`` (or rank-local metadata, or the
save's index), whether the chunks tile every tensor, whether each chunk's archive holds what
``.metadata`` promises, the saving ranks, and (``--check-values``) every tensor's values.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_tools.check import Check
from ckpt_tools.dcp import validate
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.errors import CkptError
from ckpt_tools.format import layout as L
from ckpt_tools.format.record import TrainingStep
from ckpt_tools.inspect.checks import values_check
from ckpt_tools.inspect.report import InspectReport, TensorInfo, WeightsSummary
from ckpt_tools.inspect.values import scan_dcp
from ckpt_tools.io.remote import remote_file
from ckpt_tools.st import dtypes

INDEX_SOURCES = {"index": "the save's index (.metadata.index)", "cache": "the cache of an earlier look"}


def inspect_dcp(
    directory: Path, rel: str, report: InspectReport, tensors: bool, *, record: TrainingStep | None = None
) -> None:
    """Every check of one DCP dir, its weights summary and (``tensors``) its tensors; ``record``: its ranks too."""
    try:
        index = ChunkIndex.load(directory)
    except CkptError as e:
        report.checks.append(Check.fail(f"{rel}/.metadata", str(e)))
        return
    _metadata_check(index, rel, report)
    problems = validate.structure_problems(index)
    report.checks.append(_chunks_check(problems, rel))
    _format_notes(index, rel, report.notes)
    if not problems:
        archives = _archive_check(index, rel, report.notes)
        report.checks.append(archives)
        if report.values_checked and not archives.failed:
            values_check(rel, report, lambda: scan_dcp(index, rel))
    unreferenced = index.unreferenced_files()
    if unreferenced:
        names = ", ".join(unreferenced[:5]) + (f" and {len(unreferenced) - 5} more" if len(unreferenced) > 5 else "")
        report.checks.append(Check.warn(f"{rel} files", f"not referenced by .metadata: {names}"))
    ranks = tuple(index.ranks())
    if record is not None and record.topology is not None and ranks:
        expected = record.topology.world_size
        got = max(r.rank for r in ranks) + 1
        report.checks.append(
            Check.judge(
                f"{rel} ranks",
                got == expected,
                f"shards from {got} ranks, training_step.json says world_size {expected}",
            )
        )
    top_level_keys = tuple(sorted(str(k) for k in index.top_level_keys()))
    report.weights.append(
        WeightsSummary(path=rel, format="dcp", **totals(index), ranks=ranks, top_level_keys=top_level_keys)
    )
    if tensors:
        report.tensors.extend(index_tensors(index))


def _metadata_check(index: ChunkIndex, rel: str, report: InspectReport) -> None:
    """The ``<rel>/.metadata`` check, and where the chunk table came from when not from ``.metadata``."""
    rank_local = index.table.rank_local
    read = f"rank-local metadata, the union of {', '.join(rank_local)} (no .metadata): " if rank_local else ""
    report.checks.append(
        Check.ok(
            f"{rel}/.metadata",
            f"{read}{len(index.table.names)} tensors in {index.table.rows} chunks, {len(index.byte_items)} other items",
        )
    )
    if index.origin.source in INDEX_SOURCES:
        report.notes.append(f"{rel}: chunk table read from {INDEX_SOURCES[index.origin.source]}")
    if index.origin.note:
        report.checks.append(Check.warn(f"{rel}/{L.DCP_INDEX}", index.origin.note))


def _chunks_check(problems: list[validate.Problem], rel: str) -> Check:
    """``<rel> chunks``: every chunk inside its file, the chunks tiling every tensor."""
    if problems and all(p.needs for p in problems):  # readable with a package installed: not the checkpoint's fault
        return Check.warn(f"{rel} chunks", validate.summary(problems))
    return Check.judge(
        f"{rel} chunks",
        not problems,
        validate.summary(problems) if problems else "every chunk inside its file; chunks tile every tensor exactly",
    )


def _format_notes(index: ChunkIndex, rel: str, notes: list[str]) -> None:
    """Notes on how the shards are stored: zstd-compressed chunks, dtypes safetensors cannot hold."""
    table = index.table
    if (table.byte_items and any(b.transforms for b in table.byte_items)) or np.any(
        table.transform[table.file >= 0] != 0
    ):
        notes.append(f"{rel}: chunks are zstd-compressed (torch's ZStandard extension)")
    unrepresentable = Counter(
        e.dtype for e in index.tensors.values() if not (d := dtypes.BY_NAME.get(e.dtype)) or not d.representable
    )
    if unrepresentable:
        kinds = ", ".join(f"{n} {dtype}" for dtype, n in sorted(unrepresentable.items()))
        notes.append(f"{rel}: {kinds} tensors have no safetensors dtype; convert-dcp skips them")


def _archive_check(index: ChunkIndex, rel: str, notes: list[str]) -> Check:
    """Each chunk's archive holds what ``.metadata`` promises; each non-tensor item is plain data.

    While every shard file is as it was when its archives were known sound - written by the
    save that indexed them, or checked by an earlier look - they are not read again (a note
    says so; ``--no-cache`` reads them all).
    """
    if remote_file(index.root) is not None:
        return Check.ok(
            f"{rel} chunk data",
            "not read: the shards stay on the Hub (the sizes its listing gives hold every chunk); convert-dcp reads them",
        )
    if index.archives_known_good():
        how = "as the save wrote them" if index.origin.source == "index" else "as an earlier look checked them"
        notes.append(f"{rel}: chunk archives {how}: every shard file's size and time unchanged since, not re-read")
    found = validate.archive_problems(index)
    if found:
        return Check.fail(f"{rel} chunk data", validate.summary(found))
    chunks = index.chunk_count
    items = f" and {len(index.byte_items)} non-tensor items are plain data" if index.byte_items else ""
    return Check.ok(f"{rel} chunk data", f"{chunks} chunk archives hold the dtype and shape .metadata says{items}")


def index_tensors(index: ChunkIndex) -> list[TensorInfo]:
    """Every tensor of a chunk index with its chunks (``--tensors``): DCP shards and torch's HF-storage pieces."""
    out = []
    for entry in index.tensors.values():
        chunks = tuple({"offsets": list(c.offsets), "sizes": list(c.sizes), "file": c.file} for c in entry.chunks)
        out.append(TensorInfo(entry.fqn, entry.dtype, entry.shape, chunks))
    return out


def totals(index: ChunkIndex) -> dict[str, Any]:
    """Tensor, parameter and byte counts of a chunk index, in all and by dtype (a WeightsSummary's numbers)."""
    by_dtype: Counter[str] = Counter()
    params: Counter[str] = Counter()
    for e in index.tensors.values():
        params[e.dtype] += e.numel
        if e.nbytes is not None:  # a dtype of unknown width counts its parameters only
            by_dtype[e.dtype] += e.nbytes
    return {
        "tensors": len(index.tensors),
        "parameters": sum(params.values()),
        "bytes": sum(by_dtype.values()),
        "bytes_by_dtype": dict(by_dtype),
        "parameters_by_dtype": dict(params),
    }
