"""Writing a planned conversion: one temporary sibling per output file, committed only when all are whole.

Tensor after tensor (:mod:`ckpt_tools.dcp.assemble`, :mod:`ckpt_tools.st.writer`), each file
fsynced; with ``verify`` every byte is read back (:mod:`ckpt_tools.convert.verify`) before the
temporaries are renamed into place, the index file last. Any failure before then removes the
temporaries (and the directories the conversion created): no partial output.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from tqdm import tqdm

from ckpt_tools.convert.output_dir import existing_parent, remove_empty_dirs
from ckpt_tools.convert.records import ConvertPlan, PlannedFile
from ckpt_tools.convert.verify import verify_file
from ckpt_tools.dcp.assemble import Copy, tensor_pieces
from ckpt_tools.dcp.files import ShardFiles
from ckpt_tools.dcp.reader import ChunkLayout
from ckpt_tools.errors import CkptError, UsageError, WriteError
from ckpt_tools.io.fsutil import TempSibling, fsync_dir
from ckpt_tools.st.writer import StreamingWriter, commit_output
from ckpt_tools.units import human_bytes


def check_outputs(plan: ConvertPlan, overwrite: bool) -> None:
    """Refuse to replace existing outputs without ``overwrite``, or to start without the space they need."""
    existing = [p for p in plan.output_paths if p.exists()]
    if existing and not overwrite:
        raise UsageError(
            f"{existing[0]}: already exists and is not exactly what this conversion writes (other tensors, dtype"
            " or shards, or an incomplete set); pass --overwrite to replace it"
        )
    need = plan.total_bytes
    probe = plan.output_dir if plan.output_dir.exists() else existing_parent(plan.output_dir)
    try:
        st = os.statvfs(probe)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise WriteError(f"{plan.output_dir}: not enough space ({human_bytes(need)} needed, {human_bytes(free)} free)")


def write_all(
    plan: ConvertPlan,
    layouts: Mapping[str, list[ChunkLayout]],
    files: ShardFiles,
    *,
    progress: bool,
    verify: bool,
    exclusive: bool,
) -> list[Path]:
    """Write, verify and commit every output file (``exclusive``: none may exist; one that appears
    meanwhile stops the conversion, and the files it already placed are removed again)."""
    created_dir = _make_output_dir(plan.output_dir)
    writers: list[StreamingWriter] = []
    index_writer = _IndexWriter(plan) if plan.index is not None else None
    placed: list[Path] = []
    bar = progress_bar(plan.total_bytes, enabled=progress)
    try:
        for planned_file in plan.files:
            writer = StreamingWriter(
                plan.output_dir / planned_file.name, [t.to_write() for t in planned_file.tensors], plan.metadata
            )
            writers.append(writer)
            _stream(writer, planned_file, layouts, files, bar)
        if verify:
            for writer, planned_file in zip(writers, plan.files, strict=True):
                assert writer.tmp is not None
                verify_file(writer.tmp, planned_file, layouts, files, plan.metadata)
        _commit(writers, index_writer, placed, exclusive=exclusive)
    except BaseException:
        for writer in writers:
            writer.abort()
        if index_writer is not None:
            index_writer.abort()
        for path in placed if exclusive else ():  # created by this conversion a moment ago
            path.unlink(missing_ok=True)
        if created_dir is not None:
            remove_empty_dirs(plan.output_dir, created_dir)
        raise
    finally:
        bar.close()
    fsync_dir(plan.output_dir)
    return plan.output_paths


def _make_output_dir(output_dir: Path) -> Path | None:
    """Create ``output_dir`` if missing; the existing ancestor it was created under (None: it existed)."""
    if output_dir.exists():
        return None
    created_under = existing_parent(output_dir)
    try:
        output_dir.mkdir(parents=True)
    except OSError as e:
        raise WriteError(f"{output_dir}: cannot create ({e.strerror})") from None
    return created_under


def _stream(
    writer: StreamingWriter,
    planned_file: PlannedFile,
    layouts: Mapping[str, list[ChunkLayout]],
    files: ShardFiles,
    bar: tqdm,
) -> None:
    """Write one output file's tensors into its temporary sibling, piece by piece."""
    writer.open()
    for tensor in planned_file.tensors:
        writer.begin(tensor.name)
        for piece in tensor_pieces(tensor.source, layouts[tensor.source.fqn], files, tensor.dtype):
            if isinstance(piece, Copy):
                writer.copy_from(piece.fd, piece.offset, piece.length, what=piece.what)
                bar.update(piece.length)
            else:
                writer.write(piece)
                bar.update(len(piece))
        writer.end()
    writer.finish()


def _commit(
    writers: list[StreamingWriter], index_writer: _IndexWriter | None, placed: list[Path], *, exclusive: bool
) -> None:
    """Rename the temporaries into place, the index file last (``placed``: those renamed so far)."""
    if index_writer is not None:
        index_writer.write()
    for writer in writers:
        writer.commit(exclusive=exclusive)
        placed.append(writer.path)
    if index_writer is not None:
        index_writer.commit(exclusive=exclusive)


class _IndexWriter:
    """``*.safetensors.index.json`` through a temporary sibling, renamed after the shards."""

    def __init__(self, plan: ConvertPlan) -> None:
        assert plan.index_name is not None
        self.path = plan.output_dir / plan.index_name
        self.payload = index_payload(plan)
        self._sibling: TempSibling | None = None

    def write(self) -> None:
        try:
            self._sibling = TempSibling(self.path)
            with self._sibling.open("w") as f:
                f.write(self.payload)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            self.abort()
            raise WriteError(f"{self.path}: write failed ({e.strerror})") from None

    def commit(self, *, exclusive: bool = False) -> None:
        assert self._sibling is not None
        commit_output(self._sibling, self.path, exclusive=exclusive)

    def abort(self) -> None:
        if self._sibling is not None:
            self._sibling.abort()


def index_payload(plan: ConvertPlan) -> str:
    """The text of the plan's ``*.safetensors.index.json``."""
    return json.dumps(plan.index, indent=2) + "\n"


def outputs_identical(plan: ConvertPlan, layouts: Mapping[str, list[ChunkLayout]], files: ShardFiles) -> bool:
    """Whether every planned output already exists holding exactly the planned bytes (a rerun after a kill).

    Read back and compared like a verification; any difference (or unreadable file) means no.
    """
    if not all(p.is_file() for p in plan.output_paths):
        return False
    try:
        for planned_file in plan.files:
            verify_file(plan.output_dir / planned_file.name, planned_file, layouts, files, plan.metadata)
        if plan.index_name is not None:
            return (plan.output_dir / plan.index_name).read_text(encoding="utf-8") == index_payload(plan)
    except (CkptError, OSError, UnicodeDecodeError):
        return False
    return True


def progress_bar(total: int, *, enabled: bool) -> tqdm:
    """A byte-count bar on stderr, shown only when ``enabled`` and stderr is a terminal (else a silent no-op)."""
    shown = enabled and sys.stderr.isatty()
    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc="convert-dcp",
        file=sys.stderr,
        disable=not shown,
    )
