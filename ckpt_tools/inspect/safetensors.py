"""Safetensors as ``inspect`` reports them: a file, an index and its shards, a folder of them
(``convert-dcp --max-shard-size`` output), and torch's HF-storage save, whose distributed
pieces are shown as pieces of the tensors they belong to, never as whole tensors.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import replace
from pathlib import Path

from ckpt_tools.check import Check
from ckpt_tools.dcp import hf_storage, validate
from ckpt_tools.errors import CkptError
from ckpt_tools.format import layout as L
from ckpt_tools.inspect.checks import header_check, leftovers
from ckpt_tools.inspect.dcp import index_tensors, totals
from ckpt_tools.inspect.report import InspectReport, TensorInfo, WeightsSummary
from ckpt_tools.st import dtypes
from ckpt_tools.st.header import SafetensorsHeader
from ckpt_tools.st.index import read_index

PIECES_FORMAT = "safetensors pieces (torch HF storage)"


def inspect_safetensors(path: Path, rel: str, report: InspectReport, tensors: bool) -> None:
    """A ``.safetensors`` file (a piece file of torch's HF storage included) or a ``.index.json``."""
    if path.name.endswith(".index.json"):
        inspect_index(path, rel, report, tensors)
        return
    header = header_check(path, rel, report)
    if header is None:
        return
    if hf_storage.SHARDING_INFO_KEY in header.metadata and _inspect_piece_file(header, rel, report, tensors):
        return
    report.weights.append(summary_from_headers(rel, [header]))
    if tensors:
        report.tensors.extend(_tensors_from_header(header))


def inspect_index(path: Path, rel: str, report: InspectReport, tensors: bool) -> None:
    """A ``.safetensors.index.json``: each shard's header, and every tensor it maps in the shard it names."""
    try:
        weight_map = read_index(path)
    except CkptError as e:
        report.checks.append(Check.fail(rel, str(e)))
        return
    files = sorted(set(weight_map.values()))
    headers = []
    for name in files:
        header = header_check(path.parent / name, str(Path(rel).parent / name), report)
        if header is not None:
            headers.append(header)
            missing = [k for k, f in weight_map.items() if f == name and k not in header.entries]
            if missing:
                report.checks.append(Check.fail(rel, f"{name} lacks {missing[0]} (and {len(missing) - 1} more)"))
    report.weights.append(summary_from_headers(rel, headers))
    if tensors:
        for h in headers:
            report.tensors.extend(_tensors_from_header(h))


def summary_from_headers(rel: str, headers: list[SafetensorsHeader]) -> WeightsSummary:
    """The counts of the tensors in ``headers`` (one file, or an index's shards), by dtype."""
    by_dtype: Counter[str] = Counter()
    params: Counter[str] = Counter()
    count = 0
    for header in headers:
        for e in header.entries.values():
            known = dtypes.BY_SAFETENSORS.get(e.dtype)
            name = known.name if known else e.dtype
            by_dtype[name] += e.nbytes
            params[name] += e.numel // (known.packed if known else 1)
            count += 1
    return WeightsSummary(
        path=rel,
        format="safetensors",
        tensors=count,
        parameters=sum(params.values()),
        bytes=sum(by_dtype.values()),
        bytes_by_dtype=dict(by_dtype),
        parameters_by_dtype=dict(params),
    )


def _tensors_from_header(header: SafetensorsHeader) -> list[TensorInfo]:
    out = []
    for e in header.entries.values():
        dtype = dtypes.BY_SAFETENSORS.get(e.dtype)
        shape = (dtype.torch_shape(e.shape) if dtype else None) or e.shape  # F4: torch's float4_e2m1fn_x2 shape
        out.append(TensorInfo(e.name, dtype.name if dtype else e.dtype, shape))
    return out


# ====================================================================== folders of safetensors, HF-storage pieces


def inspect_safetensors_dir(path: Path, report: InspectReport, tensors: bool) -> None:
    """A folder of safetensors: whole tensors (with or without an index), or torch's HF-storage pieces."""
    leftovers(path, [path], report)
    try:
        store = hf_storage.load(path)
    except CkptError as e:
        report.checks.append(Check.fail(path.name, str(e)))
        return
    if store.needs_merge:
        _inspect_pieces(store, report, tensors)
    else:
        indexed: set[str] = set()
        for index in sorted(path.glob(f"*{L.SAFETENSORS_INDEX_SUFFIX}")):
            with contextlib.suppress(CkptError):
                indexed |= set(read_index(index).values())
            inspect_index(index, index.name, report, tensors)
        for f in hf_storage.safetensors_files(path):
            if f.name not in indexed:
                inspect_safetensors(f, f.name, report, tensors)
    sharded = path / hf_storage.SHARDED_DIR
    if sharded.is_dir() and hf_storage.safetensors_files(sharded):
        report.notes.append(
            f"{hf_storage.SHARDED_DIR}/ holds torch's HF-storage pieces (enable_consolidation keeps them): inspect it"
            " to check them"
        )
    if not report.weights and not any(c.failed for c in report.checks):
        report.checks.append(Check.fail("weights", f"{path}: no weights found"))


def _inspect_pieces(store: hf_storage.HfStorage, report: InspectReport, tensors: bool) -> None:
    """torch's distributed HF-storage save: each file's header, then whether the pieces tile every tensor."""
    for header in store.headers:
        header_check(header.path, header.path.name, report)
    index = store.to_index()
    found = [validate.Problem(m) for m in store.problems] + validate.structure_problems(index)
    count = sum(len(p) for p in store.pieces.values())
    report.checks.append(
        Check.judge(
            "pieces",
            not found,
            validate.summary(found)
            if found
            else f"{count} pieces in {len(store.headers)} files tile all {len(store.pieces)} tensors exactly",
        )
    )
    report.weights.append(WeightsSummary(path=store.root.name, format=PIECES_FORMAT, **totals(index)))
    report.notes.append(
        f"torch's HF storage writer with save_distributed: {len(index.tensors)} tensors saved in {count} pieces;"
        f" `convert-dcp {store.root} --output DIR` merges them into whole tensors"
    )
    if tensors:
        report.tensors.extend(index_tensors(index))


def _inspect_piece_file(header: SafetensorsHeader, rel: str, report: InspectReport, tensors: bool) -> bool:
    """One file of torch's HF-storage save: report its tensors as pieces when the folder says they are.

    False when every tensor of the folder is whole (rank 0's full save): the file is then read
    as any safetensors file.
    """
    try:
        store = hf_storage.load(header.path.parent)
    except CkptError:
        store = None
    if store is None or not store.needs_merge:
        return False
    mine = [p for pieces in store.pieces.values() for p in pieces if p.file == header.path.name]
    partial = [p for p in mine if len(store.pieces[p.name]) > 1 or p.shape != store.size(p.name)]
    summary = summary_from_headers(rel, [header])
    report.weights.append(replace(summary, format=PIECES_FORMAT))
    if partial:
        p = partial[0]
        report.checks.append(
            Check.warn(
                f"{rel} pieces",
                f"{len(partial)} of its {len(mine)} tensors are pieces of larger ones (torch's HF storage,"
                f" save_distributed), e.g. {p.name} {list(p.shape)} at offset {list(p.offsets)} of"
                f" {list(store.size(p.name))}: inspect {header.path.parent}/ or merge it with convert-dcp",
            )
        )
    if tensors:
        for p in mine:
            name = dtypes.BY_SAFETENSORS[p.dtype].name
            chunk = {"offsets": list(p.offsets), "sizes": list(p.shape), "file": p.file}
            report.tensors.append(TensorInfo(p.name, name, store.size(p.name), (chunk,)))
    return True
