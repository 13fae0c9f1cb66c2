"""Write safetensors files as a stream, with memory bounded by one block, and plan shards.

The header is computed up front from the plan (names, dtypes, shapes, byte sizes), so the
tensors can then be written one after the other straight from their source: a kernel-side
copy (``copy_file_range``, falling back to ``sendfile`` and then to ``readinto``) when the
bytes need no conversion, small blocks otherwise. Each file goes to a temporary sibling
(:class:`~ckpt_tools.io.fsutil.TempSibling`, the project's one atomic-write primitive) that is
fsynced and only renamed into place by :meth:`commit`, so a crash or a full disk never leaves
a half-written file under the final name.

Shard planning follows the Hugging Face Hub convention (``model-00001-of-00003.safetensors``
and ``model.safetensors.index.json``) using huggingface_hub's own splitter.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_tools.errors import CorruptCheckpoint, UsageError, WriteError
from ckpt_tools.io.fsutil import TempSibling, sync_now
from ckpt_tools.io.remote import RemoteHandle
from ckpt_tools.io.writeback import WritebackTracker

ALIGNMENT = 8  # header padded with spaces so the data section starts 8-byte aligned
COPY_BLOCK = 8 * 2**20
_FALLBACK_ERRNOS = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.ETXTBSY}


@dataclass(frozen=True)
class TensorToWrite:
    """One header entry of a file being written: its bytes arrive later, in this order."""

    name: str
    dtype: str  # safetensors code
    shape: tuple[int, ...]
    nbytes: int


def build_header(specs: Sequence[TensorToWrite], metadata: dict[str, str] | None = None) -> bytes:
    """The 8-byte length plus the JSON header, data offsets in the order of ``specs``."""
    doc: dict[str, Any] = {}
    if metadata:
        doc["__metadata__"] = dict(metadata)
    pos = 0
    for s in specs:
        doc[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [pos, pos + s.nbytes]}
        pos += s.nbytes
    body = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    body += b" " * (-(8 + len(body)) % ALIGNMENT)
    return len(body).to_bytes(8, "little") + body


def describe_os_error(path: Path, e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return f"{path}: no space left on device"
    if e.errno == errno.EFBIG:
        return f"{path}: file too large (file size limit reached)"
    if e.errno == errno.EDQUOT:
        return f"{path}: disk quota exceeded"
    return f"{path}: write failed ({e.strerror or e})"


def commit_output(sibling: TempSibling, path: Path, *, exclusive: bool) -> None:
    """Move a conversion's complete temporary ``sibling`` to ``path``: one :class:`WriteError` line
    when the move fails, or (``exclusive``) when another process placed a file there meanwhile."""
    try:
        sibling.commit(exclusive=exclusive)
    except FileExistsError:
        raise WriteError(
            f"{path}: appeared while this conversion was writing (another process wrote it); kept as it is,"
            " nothing of this conversion was left"
        ) from None
    except OSError as e:
        raise WriteError(describe_os_error(path, e)) from None


class StreamingWriter:
    """One safetensors file written tensor by tensor into a temporary sibling of ``path``.

    Use :meth:`begin` / :meth:`write` or :meth:`copy_from` / :meth:`end` per tensor, in the
    order of ``specs``; then :meth:`finish` (fsync) and :meth:`commit` (rename), or
    :meth:`abort` on any failure.
    """

    def __init__(self, path: Path, specs: Sequence[TensorToWrite], metadata: dict[str, str] | None = None) -> None:
        self.path = Path(path)
        self.specs = list(specs)
        self.header = build_header(self.specs, metadata)
        self.size = len(self.header) + sum(s.nbytes for s in self.specs)
        self._sibling: TempSibling | None = None
        self._next = 0
        self._left = 0
        self._buffer: bytearray | None = None
        self._writeback = WritebackTracker()

    @property
    def tmp(self) -> Path | None:
        """The temporary file being written (None before :meth:`open` and after commit or abort)."""
        return self._sibling.tmp if self._sibling is not None else None

    @property
    def _fd(self) -> int | None:
        return self._sibling.fd if self._sibling is not None else None

    # ------------------------------------------------------------------ life cycle

    def open(self) -> None:
        try:
            self._sibling = TempSibling(self.path)
        except OSError as e:
            raise WriteError(describe_os_error(self.path, e)) from None
        self._write_all(self.header)
        self._writeback.due(len(self.header))

    def finish(self) -> None:
        """All tensors written: fsync and close the temporary file."""
        if self._next != len(self.specs) or self._left:
            raise AssertionError("StreamingWriter.finish before every tensor was written")
        assert self._sibling is not None and self._sibling.fd is not None
        try:
            self._sibling.close(sync=sync_now())
        except OSError as e:
            raise WriteError(describe_os_error(self.path, e)) from None

    def commit(self, *, exclusive: bool = False) -> None:
        """Move the complete file into place (``exclusive``: never over a file that appeared meanwhile)."""
        assert self._sibling is not None
        commit_output(self._sibling, self.path, exclusive=exclusive)
        self._sibling = None

    def abort(self) -> None:
        if self._sibling is not None:
            self._sibling.abort()
            self._sibling = None

    # ------------------------------------------------------------------ tensors

    def begin(self, name: str) -> None:
        if self._left:
            raise AssertionError(f"{self.specs[self._next - 1].name}: {self._left} bytes still to write")
        spec = self.specs[self._next]
        if spec.name != name:
            raise AssertionError(f"tensor {name} written out of order (expected {spec.name})")
        self._next += 1
        self._left = spec.nbytes

    def write(self, data: bytes | memoryview) -> None:
        n = len(memoryview(data).cast("B"))
        if n > self._left:
            raise AssertionError("more bytes than the tensor holds")
        self._write_all(data)
        self._left -= n
        self._advance(n)

    def end(self) -> None:
        if self._left:
            raise AssertionError(f"{self.specs[self._next - 1].name}: {self._left} bytes missing")

    def copy_from(self, src_fd: int | RemoteHandle, src_offset: int, length: int, *, what: str) -> None:
        """Append ``length`` bytes of ``src_fd`` starting at ``src_offset``, kernel-side when possible."""
        if length > self._left:
            raise AssertionError("more bytes than the tensor holds")
        assert self._fd is not None
        copy_range(src_fd, src_offset, self._fd, length, what=what, dest=self.path, buffer=self._scratch)
        self._left -= length
        self._advance(length)

    def _advance(self, n: int) -> None:
        """Start writeback of what was written so far, every ``WRITEBACK_EVERY`` bytes (see :mod:`writeback`).

        The disk then works while we copy, and the final fsync has little left to do.
        """
        if self._writeback.due(n) and self._fd is not None:
            self._writeback.hand_over(self._fd)

    def _scratch(self) -> bytearray:
        if self._buffer is None:
            self._buffer = bytearray(COPY_BLOCK)
        return self._buffer

    def _write_all(self, data: bytes | memoryview) -> None:
        assert self._fd is not None
        view = memoryview(data).cast("B")
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as e:
            raise WriteError(describe_os_error(self.path, e)) from None


def copy_range(
    src_fd: int | RemoteHandle,
    src_offset: int,
    dst_fd: int,
    length: int,
    *,
    what: str,
    dest: Path,
    buffer: Callable[[], bytearray],
) -> None:
    """Copy ``length`` bytes at ``src_offset`` to the current position of ``dst_fd``.

    ``copy_file_range`` keeps the bytes in the kernel (no user-space copy, no RSS); where the
    file systems or the kernel refuse it, ``sendfile`` does the same, and a plain
    ``preadv``/``write`` loop over one reusable buffer is the last resort.
    """
    if isinstance(src_fd, RemoteHandle):
        _copy_remote(src_fd, src_offset, dst_fd, length, what=what, dest=dest)
        return
    done = 0
    method = "copy_file_range" if hasattr(os, "copy_file_range") else "sendfile"
    while done < length:
        want = min(length - done, 1 << 30)
        try:
            if method == "copy_file_range":
                n = os.copy_file_range(src_fd, dst_fd, want, src_offset + done)
            elif method == "sendfile":
                n = os.sendfile(dst_fd, src_fd, src_offset + done, want)
            else:
                n = _read_write(src_fd, src_offset + done, dst_fd, want, buffer())
        except OSError as e:
            if e.errno in _FALLBACK_ERRNOS and method != "readinto" and not (e.errno == errno.EBADF and done):
                method = "sendfile" if method == "copy_file_range" else "readinto"
                continue
            if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                raise WriteError(describe_os_error(dest, e)) from None
            raise WriteError(f"{dest}: copying from {what} failed ({e.strerror or e})") from None
        if n == 0:
            raise CorruptCheckpoint(f"{what}: file ends before the chunk data does (truncated file)")
        done += n


def _copy_remote(src: RemoteHandle, offset: int, dst_fd: int, length: int, *, what: str, dest: Path) -> None:
    """Stream a span of a file on the Hub: one ranged read of at most :data:`COPY_BLOCK` bytes at a time."""
    done = 0
    while done < length:
        data = src.pread(min(length - done, COPY_BLOCK), offset + done)
        if not data:
            raise CorruptCheckpoint(f"{what}: file ends before the chunk data does (truncated file)")
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(dst_fd, view) :]
        except OSError as e:
            raise WriteError(describe_os_error(dest, e)) from None
        done += len(data)


def _read_write(src_fd: int, offset: int, dst_fd: int, want: int, buffer: bytearray) -> int:
    view = memoryview(buffer)[: min(want, len(buffer))]
    n = os.preadv(src_fd, [view], offset)
    if n == 0:
        return 0
    out = view[:n]
    while out:
        w = os.write(dst_fd, out)
        out = out[w:]
    return n


# ---------------------------------------------------------------------- shard planning


@dataclass(frozen=True)
class ShardPlan:
    """Which tensors go to which file; ``index`` is the ``*.index.json`` payload when sharded."""

    files: dict[str, list[str]]
    index: dict[str, Any] | None


_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(I?)B?")


def parse_size(value: str | int) -> int:
    """``"500MB"``, ``"2GB"``, ``"1.5GiB"``, ``"123456"`` → bytes.

    Decimal units (``KB``/``MB``/``GB``/``TB``) mean powers of 1000, as on the Hub and in
    transformers' ``max_shard_size``; ``KiB``/``MiB``/``GiB``/``TiB`` are powers of 1024.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        m = _SIZE_RE.fullmatch(str(value).strip().upper())
        if m is None:
            raise UsageError(f"--max-shard-size: cannot parse {value!r} (use bytes or a size like 500MB, 2GB, 1GiB)")
        number, unit, binary = m.groups()
        scale = (1024 if binary else 1000) ** " KMGT".index(unit or " ")
        if binary and not unit:
            raise UsageError(f"--max-shard-size: cannot parse {value!r}")
        size = int(float(number) * scale)
    if size <= 0:
        raise UsageError(f"--max-shard-size must be positive, got {value!r}")
    return size


def plan_shards(specs: Sequence[TensorToWrite], max_shard_size: int | None, stem: str = "model") -> ShardPlan:
    """Split ``specs`` (in order) into files of at most ``max_shard_size`` data bytes each.

    One file (``{stem}.safetensors``, no index) when everything fits; otherwise the Hub's
    ``{stem}-0000i-of-0000n.safetensors`` names and an index mapping every tensor to its file.
    A tensor larger than the limit gets a file of its own, as on the Hub.
    """
    single = f"{stem}.safetensors"
    if max_shard_size is None or sum(s.nbytes for s in specs) <= max_shard_size:
        return ShardPlan({single: [s.name for s in specs]}, None)
    from huggingface_hub.serialization._base import split_state_dict_into_shards_factory

    by_name = {s.name: s for s in specs}
    split = split_state_dict_into_shards_factory(
        by_name,
        get_storage_size=lambda s: s.nbytes,
        filename_pattern=stem + "{suffix}.safetensors",
        max_shard_size=max_shard_size,
    )
    if not split.is_sharded:
        return ShardPlan({single: [s.name for s in specs]}, None)
    index = {
        "metadata": {"total_size": sum(s.nbytes for s in specs)},
        "weight_map": dict(sorted(split.tensor_to_filename.items())),
    }
    return ShardPlan({f: list(names) for f, names in split.filename_to_tensors.items()}, index)
