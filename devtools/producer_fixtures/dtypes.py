"""A DCP checkpoint (torch's ``FileSystemWriter``) holding one tensor of every dtype torch can save.

``model/`` is ``dcp.save({"model": {...}}, no_dist=True)`` - accelerate's layout - with a tensor
of each of torch's dense dtypes: the ones safetensors can hold (float64 ... bool, complex64, the
five float8 types, uint16/32/64, float4_e2m1fn_x2 as ``F4``) and the ones it cannot (complex128,
complex32; torch's DCP cannot save the sub-byte ``uint4`` at all: its element size raises in
``torch.iinfo``). The values cover
each type's special values (NaN, infinities, subnormals, every float8 byte value).
"""

from __future__ import annotations

from devtools.producer_fixtures.common import fresh, write_readme

NAME = "dtypes"


def state() -> dict[str, object]:
    import torch

    g = torch.Generator().manual_seed(1)
    base = torch.randn(4, 6, generator=g)
    special = torch.tensor([0.0, -0.0, 1e-40, float("inf"), float("-inf"), float("nan")])
    every_byte = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    out: dict[str, object] = {
        "f64": base.double(),
        "f32": torch.cat([base.flatten(), special]),
        "f16": base.half(),
        "bf16": base.bfloat16(),
        "c64": torch.complex(base, -base),
        "c128": torch.complex(base.double(), base.double() * 2),
        "i64": torch.arange(-6, 6, dtype=torch.int64),
        "i32": torch.arange(-6, 6, dtype=torch.int32),
        "i16": torch.arange(-6, 6, dtype=torch.int16),
        "i8": torch.arange(-6, 6, dtype=torch.int8),
        "u8": torch.arange(12, dtype=torch.uint8),
        "u16": torch.arange(60000, 60012, dtype=torch.int64).to(torch.uint16),
        "u32": torch.arange(12, dtype=torch.int64).add(2**31).to(torch.uint32),
        "u64": torch.arange(12, dtype=torch.int64).to(torch.uint64),
        "bool": torch.arange(12) % 3 == 0,
        "scalar": torch.tensor(2.5),
        "f4x2": every_byte.view(torch.float4_e2m1fn_x2),
        "c32": torch.complex(base.half(), base.half()),
    }
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"):
        out[name] = every_byte.view(getattr(torch, name))
    return out


def main() -> None:
    import warnings

    import torch.distributed.checkpoint as dcp

    root = fresh(NAME)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": state()}, checkpoint_id=str(root / "model"), no_dist=True)
    write_readme(root, "every dtype in a DCP checkpoint", __doc__ or "")
    print(f"wrote {root}")


if __name__ == "__main__":
    main()
