"""Undo the stream transforms torch's DCP writer applies: ``FileSystemWriter(_extensions=[ZStandard()])``.

With an extension, each item's span in a ``.distcp`` file is the item's usual bytes (a
torch.save archive) passed through the transform, and ``.metadata`` lists the transform's
descriptor for that item (``stream.zstd/1`` for torch's ``ZStandard``; torch's reader looks it
up in its extension registry). The only one torch ships is zstd, which needs the optional
``zstandard`` package (the ``zstd`` extra); without it the one line says to install it.

Decompression streams a block at a time into an anonymous temporary file and stops at a
bound the caller derives from ``.metadata`` (the chunk's bytes plus the archive's few
headers), so a small stream that claims to expand into gigabytes is refused, not unpacked.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import IO, Any

from ckpt_tools.errors import CheckpointError, CorruptCheckpoint
from ckpt_tools.io.remote import Readable, pread

ZSTD = "stream.zstd"  # ZStandard.registry_name()
ZSTD_PACKAGE = "zstandard"
INSTALL_HINT = "pip install zstandard, or the ckpt-tools[zstd] extra"
BLOCK = 4 * 2**20


def unsupported(descriptors: Sequence[str]) -> str | None:
    """Why a transform list cannot be undone here (None: it is one zstd layer, version 1, as torch writes)."""
    name, _, version = descriptors[0].partition("/") if len(descriptors) == 1 else ("", "", "")
    if name != ZSTD or version.partition(".")[0] != "1":
        return f"stored with transforms {list(descriptors)}, which are not supported (only {ZSTD}/1)"
    return None


def zstd_available() -> bool:
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


def missing_zstd_message(where: str) -> str:
    return (
        f"{where}: stored zstd-compressed (torch's ZStandard extension); install zstandard to read it ({INSTALL_HINT})"
    )


class _Span(io.RawIOBase):
    """``[offset, offset+length)`` of an open file as a readable stream (positioned reads)."""

    def __init__(self, fd: Readable, offset: int, length: int) -> None:
        self.fd, self.pos, self.end = fd, offset, offset + length

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        n = min(len(b), self.end - self.pos)
        if n <= 0:
            return 0
        data = pread(self.fd, n, self.pos)
        b[: len(data)] = data
        self.pos += len(data)
        return len(data)


def undo(
    fd: Readable, offset: int, length: int, descriptors: Sequence[str], out: IO[bytes], *, limit: int, what: str
) -> int:
    """Write the original bytes of a transformed span to ``out``; return how many (at most ``limit``)."""
    problem = unsupported(descriptors)
    if problem:
        raise CheckpointError(f"{what}: {problem}")
    if not zstd_available():
        raise CheckpointError(missing_zstd_message(what))
    import zstandard

    produced = 0
    try:
        span: Any = _Span(fd, offset, length)  # a file-like view: what stream_reader reads from
        reader = zstandard.ZstdDecompressor().stream_reader(span, read_across_frames=True)
        while block := reader.read(BLOCK):
            produced += len(block)
            if produced > limit:
                raise CorruptCheckpoint(
                    f"{what}: zstd stream expands beyond {limit} bytes, more than .metadata accounts for"
                )
            out.write(block)
    except zstandard.ZstdError as e:
        raise CorruptCheckpoint(f"{what}: not a valid zstd stream ({e})") from None
    out.flush()
    return produced
