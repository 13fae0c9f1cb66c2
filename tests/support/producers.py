"""The committed producer fixtures (fixtures/producers/, written by devtools/producer_fixtures/) and their readers.

Two sides for each fixture: the tool, run in one interpreter where torch cannot be imported
(:func:`convert_without_torch`), and torch's own reader of that format (the ``torch_*``
functions, in the test process), whose tensors the tool's output must equal bit for bit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from devtools.procs import REPO, no_torch_env

PRODUCERS = REPO / "fixtures" / "producers"
HF = PRODUCERS / "hf_storage"
HF_FULL = HF / "full"
HF_DISTRIBUTED = HF / "distributed"
HF_CONSOLIDATED = HF / "consolidated"
HF_PIECES_OF_CONSOLIDATED = HF_CONSOLIDATED / "sharded"
HF_EXPECTED = HF / "expected.safetensors"
DTYPES_DCP = PRODUCERS / "dtypes" / "model"
ZSTD_DCP = PRODUCERS / "zstd" / "model"
RANK_LOCAL_DCP = PRODUCERS / "rank_local" / "model"

_CONVERT_ALL = """
import json, sys
from ckpt_tools.convert import convert_dcp
from ckpt_tools.errors import CkptError
out = {}
for name, kwargs in json.loads(sys.stdin.read()).items():
    try:
        out[name] = {"result": convert_dcp(progress=False, **kwargs).to_dict()}
    except CkptError as e:
        out[name] = {"error": str(e), "exit_code": int(e.exit_code)}
assert "torch" not in sys.modules
print(json.dumps(out))
"""


def convert_without_torch(jobs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``convert_dcp(**kwargs)`` for each job, in one interpreter with torch blocked: its result or its error."""
    proc = subprocess.run(
        [sys.executable, "-c", _CONVERT_ALL],
        input=json.dumps(jobs),
        env=no_torch_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def same_bits(a: Any, b: Any) -> bool:
    """Equal dtype, shape and bytes (NaN payloads and -0.0 included)."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.contiguous().view(-1).view(torch.uint8).equal(b.contiguous().view(-1).view(torch.uint8))


def torch_dcp(dcp_dir: Path, scratch: Path) -> dict[str, Any]:
    """torch's own conversion of a DCP directory (``dcp_to_torch_save``), the ``model`` entries flattened."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = scratch / f"{dcp_dir.parent.name}.pt"
    if not target.exists():
        dcp_to_torch_save(dcp_dir, target)
    loaded = torch.load(target, weights_only=True)
    return dict(loaded["model"])


def torch_hf(folder: Path) -> dict[str, Any]:
    """What torch's ``HuggingFaceStorageReader`` loads from ``folder``: whole tensors, sized as its metadata says."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    metadata = HuggingFaceStorageReader(str(folder)).read_metadata()
    state = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in metadata.state_dict_metadata.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=HuggingFaceStorageReader(str(folder)), no_dist=True)
    return state


def torch_rank_local(dcp_dir: Path) -> dict[str, Any]:
    """torch's loader reading each rank's ``__<r>.metadata`` (as rank r does) into one set of whole tensors."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    class RankReader(FileSystemReader):
        def __init__(self, path: Path, rank: int) -> None:
            super().__init__(str(path))
            self.rank = rank

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            return super().read_metadata(rank=self.rank)

    ranks = sorted(int(p.name[2:].split(".")[0]) for p in dcp_dir.glob("__*.metadata"))
    first = RankReader(dcp_dir, ranks[0]).read_metadata()
    state = {
        k: torch.zeros(tuple(m.size), dtype=m.properties.dtype)
        for k, m in first.state_dict_metadata.items()
        if hasattr(m, "size")
    }
    for rank in ranks:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(
                {"model": {k.removeprefix("model."): v for k, v in state.items()}},
                storage_reader=RankReader(dcp_dir, rank),
                no_dist=True,
            )
    return {k.removeprefix("model."): v for k, v in state.items()}
