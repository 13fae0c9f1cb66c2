"""The fast full-content digest of checkpoint files: xxh3-128, computed as the bytes are written.

BLAKE2b over a whole multi-GB shard would cost a save more than its serialization; xxh3 runs
at memory speed (tens of GB/s per core), so every byte a save writes can be digested on its
way to the file at a few per cent of the write. It is a checksum against accidents - a
flipped bit, a torn or swapped file - not a defence against someone forging a file: the
cheap check of :mod:`ckpt_tools.format.rules.save_files` keeps BLAKE2b for what it digests.

:data:`DISABLE_ENV` turns the digests of a save off; it exists for ``bin/bench-save``'s
with/without comparison only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import xxhash

ALGORITHM = "xxh3_128"
READ = 8 * 2**20  # bytes per read when a file is digested from disk: bounded memory at any size
DISABLE_ENV = "CKPT_TOOLS_BENCH_NO_DIGESTS"  # "1": saves record no full digests (bench-save's comparison)


def enabled() -> bool:
    """Whether saves compute full digests (always, except in bench-save's comparison)."""
    return os.environ.get(DISABLE_ENV, "") in ("", "0")


def hasher() -> Any:
    return xxhash.xxh3_128()


def of_bytes(data: Any) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def of_range(
    fd: int,
    offset: int,
    length: int,
    buffer: bytearray | None = None,
    on_read: Callable[[int], None] | None = None,
) -> tuple[str, int]:
    """The digest of ``length`` bytes at ``offset`` of ``fd``, read :data:`READ` bytes at a time.

    Returns (digest, bytes actually read): fewer than ``length`` when the file is shorter.
    ``on_read`` is told each block's size as it is read (a progress bar's advance).
    """
    h = hasher()
    buffer = buffer if buffer is not None else bytearray(READ)
    view = memoryview(buffer)
    done = 0
    while done < length:
        want = min(len(buffer), length - done)
        got = os.preadv(fd, [view[:want]], offset + done)
        if got <= 0:
            break
        h.update(view[:got])
        done += got
        if on_read is not None:
            on_read(got)
    return h.hexdigest(), done


def of_file(path: str | os.PathLike[str]) -> tuple[int, str]:
    """(size, digest) of a whole file, streamed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        digest, _ = of_range(fd, 0, size)
        return size, digest
    finally:
        os.close(fd)
