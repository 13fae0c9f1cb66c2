"""The torch-free NaN/inf count of ``inspect --check-values``, against torch's own isnan/isinf.

Every float type a checkpoint can hold, both byte orders, and a strided DCP chunk read slab by
slab (the block made small so that a small tensor needs many reads).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ckpt_tools.dcp.reader import ChunkLayout
from ckpt_tools.inspect import values
from ckpt_tools.st import dtypes

SPECIALS = [float("nan"), float("inf"), float("-inf"), -float("nan")]


def sample(dtype: torch.dtype) -> torch.Tensor:
    """Finite values of every magnitude the type has (subnormals, max), zeros of both signs, and specials."""
    info = torch.finfo(dtype)
    finite = [0.0, -0.0, 1.0, -2.5, info.max, -info.max, info.tiny, info.tiny / 4, info.smallest_normal]
    x = torch.tensor(finite * 3 + SPECIALS * 2 + [1.0] * 5, dtype=torch.float64).to(dtype)
    return x[torch.randperm(len(x), generator=torch.Generator().manual_seed(0))]


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e5m2, torch.float8_e4m3fn]
)
def test_counts_match_torch_for_every_float_type(dtype: torch.dtype) -> None:
    x = sample(dtype)
    info = dtypes.lookup(str(dtype))
    code = {8: "u8", 4: "u4", 2: "u2", 1: "u1"}[info.itemsize]
    raw = x.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[info.itemsize]).numpy().tobytes()
    wide = x.double()  # exact for every narrower type
    expected = (int(wide.isnan().sum()), int(wide.isinf().sum()))
    assert expected[0] > 0 and (expected[1] > 0) == (dtype != torch.float8_e4m3fn)  # e4m3fn: inf → NaN
    little = np.frombuffer(raw, dtype="<" + code if code != "u1" else "u1")
    assert values.count_nonfinite(little, info) == expected
    big = little.byteswap().view(little.dtype.newbyteorder(">"))  # same values, stored big-endian
    assert values.count_nonfinite(big, info) == expected


def test_a_strided_chunk_is_read_slab_by_slab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transposed 64×48 float32 view of its storage, read with a 1 KiB block: 12 slabs, right counts."""
    storage = torch.randn(48, 64)
    storage[3, 5] = float("nan")
    storage[40, 63] = float("inf")
    storage[0, 0] = float("nan")
    view = storage.t()  # size (64, 48), stride (1, 64): not contiguous
    path = tmp_path / "chunk.bin"
    path.write_bytes(b"\0" * 16 + storage.numpy().tobytes())
    layout = ChunkLayout(dtypes.lookup("float32"), tuple(view.shape), tuple(view.stride()), 16, "little")
    assert not layout.contiguous
    reads = []
    real_pread = values.pread_exact

    def counting_pread(fd: int, length: int, offset: int, *, what: str) -> bytes:
        reads.append(length)
        return real_pread(fd, length, offset, what=what)

    monkeypatch.setattr(values, "BLOCK", 1024)
    monkeypatch.setattr(values, "pread_exact", counting_pread)
    counter = values._Counter()
    with path.open("rb") as f:
        values._chunk_counts(f.fileno(), layout, counter, "chunk")
    assert (counter.nan, counter.inf) == (2, 1)
    assert len(reads) > 1 and max(reads) <= 1024


@pytest.mark.parametrize(
    "dtype",
    [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu],
)
def test_every_float8_byte_value_counts_as_torch_says(dtype: torch.dtype) -> None:
    """All 256 bit patterns: the fnuz types and e8m0 have one NaN each and no infinity."""
    every = torch.arange(256, dtype=torch.uint8)
    wide = every.view(dtype).double()
    expected = (int(wide.isnan().sum()), int(wide.isinf().sum()))
    info = dtypes.lookup(str(dtype))
    assert values.checked(info) and expected[0] > 0
    assert values.count_nonfinite(every.numpy(), info) == expected
