"""A step's files against the record of the save that wrote them (``save_files.json``), read and compared.

The record and its rules live in :mod:`ckpt_tools.format.rules.save_files`; this module reads
what each file is now - its size, the digest of its bytes (or of both ends of a bulk file), the
save id stamped into it (:mod:`ckpt_tools.facts.save_stamps`) - and says which files are not
what the save wrote. The resume refuses with :func:`mismatch`; the tools report :func:`problems`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ckpt_tools.facts.save_stamps import stamped_id
from ckpt_tools.format import layout as L
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.rules import save_stamps
from ckpt_tools.format.rules.save_files import ALL, EDITABLE, SaveFiles, differs, read, summary
from ckpt_tools.io.remote import remote_file


def problems(paths: StepPaths, saved: SaveFiles, bulk_share: tuple[int, int] | None = ALL) -> list[str]:
    """Every file that is not what the save wrote: changed size or content, or a shard it did not write.

    ``bulk_share`` ``(r, n)``: sample the ends of every n-th bulk file from the r-th on (the
    trainer's ranks share the reads: each file is read once in the job, not once per rank);
    None: bulk files by size only. Sizes and every other file are always checked whole. A step on
    the Hub: bulk files by size only (the listing's), so that no check downloads from a shard.
    """
    if remote_file(paths.root) is not None:
        bulk_share = None
    out: list[str] = []
    bulk_seen = 0
    for rel, recorded in saved.files.items():
        if rel in EDITABLE:
            continue
        sample = True
        if recorded.sampled:
            sample = bulk_share is not None and bulk_seen % bulk_share[1] == bulk_share[0]
            bulk_seen += 1
        out += differs(paths, rel, recorded, sample, _stamp_check(rel, saved.save_id))
    for directory in (paths.model_dcp, paths.optimizer_dcp):
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():  # a local directory or one on the Hub alike
            rel = f"{directory.relative_to(paths.root).as_posix()}/{entry.name}"
            dcp_file = entry.name.endswith(L.DCP_SHARD_SUFFIX) or entry.name == L.DCP_METADATA
            if dcp_file and rel not in saved.files:
                out.append(f"{rel}: a DCP file the save did not write")
    return out


def mismatch(paths: StepPaths, bulk_share: tuple[int, int] | None = ALL) -> str | None:
    """The line that refuses ``paths`` (None: its files are its save's, or it has no record)."""
    saved = read(paths)
    if saved is None:
        return None
    found = problems(paths, saved, bulk_share)
    return summary(paths, found) if found else None


def _stamp_check(rel: str, save_id: str | None) -> Callable[[Path], str | None] | None:
    """The line for ``rel`` stamped by another save than ``save_id`` (None: the record names no save)."""
    if save_id is None:
        return None

    def check(path: Path) -> str | None:
        stamped = stamped_id(path)
        return save_stamps.problem(rel, stamped, save_id) if stamped is not None and stamped != save_id else None

    return check
