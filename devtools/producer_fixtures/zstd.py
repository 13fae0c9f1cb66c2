"""A DCP checkpoint written through torch's zstd extension: ``FileSystemWriter(_extensions=[ZStandard()])``.

``model/`` is ``dcp.save({"model": {...}, "step": 7}, storage_writer=...)`` in one process: every
tensor chunk and the non-tensor ``step`` item is a zstd stream (``.metadata`` names the transform
``stream.zstd/1`` for each), which torch's ``FileSystemReader`` decompresses on load. Needs the
``zstandard`` package (``pip install zstandard``).
"""

from __future__ import annotations

from devtools.producer_fixtures.common import fresh, tensors, write_readme

NAME = "zstd"


def main() -> None:
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._extension import ZStandard

    root = fresh(NAME)
    writer = dcp.FileSystemWriter(str(root / "model"), _extensions=[ZStandard()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": tensors(2), "step": 7}, storage_writer=writer, no_dist=True)
    write_readme(root, "torch's zstd-compressed DCP", __doc__ or "")
    print(f"wrote {root}")


if __name__ == "__main__":
    main()
