"""The torch.save archives a DCP shard file is made of, as torch's writer produces them.

Each chunk of a DCP save is one ``torch.save`` archive of the chunk's tensor, written to an
in-memory stream (so every record is named ``archive/...``). With the per-chunk CRC32 off (the
trainer's setting, :func:`ckpt_tools.train.checkpoint.dcp_io.dcp_save`) an archive's bytes
around the tensor data depend only on the tensor's dtype and shape; with it on, on the data's
CRC too. An all-zero tensor of the chunk's dtype and shape is therefore a byte-exact template
either way: a sparse file whose data region is a hole reads back as those zeros. Even the
``.data/serialization_id`` record torch adds is the same for the same dtype, shape and data
(it is derived from the records, not random), so templates are shared by every chunk of a
shape: :class:`Templates` caches them.
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # a zip member's local file header


@contextmanager
def crc32_setting(enabled: bool) -> Iterator[None]:
    """torch.save with or without its per-record CRC32 (the trainer's DCP save turns it off)."""
    from torch.utils.serialization import config

    previous = config.save.compute_crc32
    config.save.compute_crc32 = enabled
    try:
        yield
    finally:
        config.save.compute_crc32 = previous


def torch_save_bytes(obj: Any, crc32: bool) -> bytes:
    """What DCP writes for one item: ``torch.save(obj)`` into a stream."""
    buffer = io.BytesIO()
    with crc32_setting(crc32):
        torch.save(obj, buffer)
    return buffer.getvalue()


@dataclass(frozen=True)
class ArchiveTemplate:
    """One chunk's archive split around its tensor data, which a sparse file leaves as a hole."""

    head: bytes  # every byte before the tensor data
    data: int  # the tensor data's length
    tail: bytes  # every byte after it
    length: int = field(init=False)  # the whole archive's

    def __post_init__(self) -> None:
        object.__setattr__(self, "length", len(self.head) + self.data + len(self.tail))


def split_archive(archive: bytes, data_bytes: int) -> ArchiveTemplate:
    """Cut a one-tensor archive around its storage record ``archive/data/0``."""
    if data_bytes == 0:
        return ArchiveTemplate(archive, 0, b"")
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        info = z.getinfo("archive/data/0")
    fields = _LOCAL_HEADER.unpack_from(archive, info.header_offset)
    start = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
    if info.file_size != data_bytes:
        raise ValueError(f"archive/data/0 holds {info.file_size} bytes, the tensor {data_bytes}")
    return ArchiveTemplate(archive[:start], data_bytes, archive[start + data_bytes :])


class Templates:
    """Chunk archive templates by (dtype, shape): a model has a handful of distinct chunk shapes."""

    def __init__(self, crc32: bool) -> None:
        self.crc32 = crc32
        self._cache: dict[tuple[torch.dtype, tuple[int, ...]], ArchiveTemplate] = {}

    def get(self, dtype: torch.dtype, shape: tuple[int, ...]) -> ArchiveTemplate:
        key = (dtype, shape)
        template = self._cache.get(key)
        if template is None:
            zeros = torch.zeros(shape, dtype=dtype)
            archive = torch_save_bytes(zeros, self.crc32)
            template = self._cache[key] = split_archive(archive, zeros.numel() * zeros.element_size())
        return template
