"""convert-dcp on checkpoints other producers wrote (fixtures/producers/), bit-identical to torch's own reader.

The tool runs with torch blocked (one interpreter for every conversion, :func:`convert_without_torch`);
torch reads the same fixtures in this process: its HF-storage reader for the safetensors
pieces, ``dcp_to_torch_save`` for the DCP ones, its loader per rank for rank-local metadata.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tools.convert import convert_dcp
from ckpt_tools.errors import CheckpointError, UsageError
from devtools.procs import run_cli
from tests.support.producers import (
    DTYPES_DCP,
    HF_CONSOLIDATED,
    HF_DISTRIBUTED,
    HF_EXPECTED,
    HF_FULL,
    HF_PIECES_OF_CONSOLIDATED,
    RANK_LOCAL_DCP,
    ZSTD_DCP,
    convert_without_torch,
    same_bits,
    torch_dcp,
    torch_hf,
    torch_rank_local,
)

UNREPRESENTABLE = {"c128": "complex128", "c32": "complex32"}
CAST = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("producers")
    jobs: dict[str, dict[str, Any]] = {
        "hf distributed": {"checkpoint_dir": str(HF_DISTRIBUTED), "output": str(out / "hf")},
        "hf one piece": {
            "checkpoint_dir": str(next(HF_DISTRIBUTED.glob("shard-00002-*.safetensors"))),
            "output": str(out / "hf-piece" / "model.safetensors"),
        },
        "hf sharded": {"checkpoint_dir": str(HF_PIECES_OF_CONSOLIDATED), "output": str(out / "hf-sharded")},
        "hf full": {"checkpoint_dir": str(HF_FULL), "output": str(out / "hf-full")},
        "hf consolidated": {"checkpoint_dir": str(HF_CONSOLIDATED), "output": str(out / "hf-consolidated")},
        "hf no output": {"checkpoint_dir": str(HF_DISTRIBUTED)},
        "zstd": {"checkpoint_dir": str(ZSTD_DCP), "output": str(out / "zstd")},
        "rank local": {"checkpoint_dir": str(RANK_LOCAL_DCP), "output": str(out / "rank-local")},
        "dtypes": {"checkpoint_dir": str(DTYPES_DCP), "output": str(out / "dtypes")},
    }
    for name in CAST:
        jobs[f"dtypes {name}"] = {
            "checkpoint_dir": str(DTYPES_DCP),
            "output": str(out / f"dtypes-{name}"),
            "dtype": name,
        }
    results = convert_without_torch(jobs)
    return {"out": out, "results": results, "scratch": tmp_path_factory.mktemp("torch")}


def written(converted: dict[str, Any], job: str) -> dict[str, torch.Tensor]:
    result = converted["results"][job]
    assert "result" in result, result
    (path,) = result["result"]["output_files"]
    return load_file(path)


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert same_bits(got[name], tensor), name


def test_distributed_hf_pieces_merge_into_what_torch_reads(converted: dict[str, Any]) -> None:
    """save_distributed pieces (a 3-rank gloo run: Shard(0), Shard(1), uneven rows, replicated) → whole tensors."""
    got = written(converted, "hf distributed")
    assert_same(got, torch_hf(HF_DISTRIBUTED))
    assert_same(got, load_file(str(HF_EXPECTED)))  # and what the ranks started from
    assert got["embed.weight"].shape == (9, 5)  # from three [3, 5] pieces


def test_one_piece_names_its_folder_and_the_whole_is_merged(converted: dict[str, Any]) -> None:
    result = converted["results"]["hf one piece"]["result"]
    assert any("merging every piece in" in n for n in result["notes"]), result["notes"]
    assert_same(written(converted, "hf one piece"), torch_hf(HF_DISTRIBUTED))


def test_pieces_merge_into_torchs_own_consolidation(converted: dict[str, Any]) -> None:
    """consolidated/sharded/ merged equals the model-00001-of-00001.safetensors torch consolidated next to it."""
    got = written(converted, "hf sharded")
    assert_same(got, load_file(str(HF_CONSOLIDATED / "model-00001-of-00001.safetensors")))
    assert_same(got, torch_hf(HF_PIECES_OF_CONSOLIDATED))


@pytest.mark.parametrize("job", ["hf full", "hf consolidated"])
def test_whole_safetensors_have_nothing_to_convert(converted: dict[str, Any], job: str) -> None:
    error = converted["results"][job]
    assert error.get("exit_code") == CheckpointError.exit_code, error
    assert "nothing to convert" in error["error"] and "whole tensors" in error["error"]
    assert not (converted["out"] / job.replace(" ", "-")).exists()


def test_pieces_without_output_are_refused_before_writing(converted: dict[str, Any]) -> None:
    error = converted["results"]["hf no output"]
    assert "give --output" in error.get("error", ""), error
    assert sorted(p.name for p in HF_DISTRIBUTED.iterdir()) == [
        f"shard-0000{r}-model-00001-of-00001.safetensors" for r in (1, 2, 3)
    ]


def test_the_cli_says_nothing_to_convert_in_one_line_without_torch() -> None:
    proc = run_cli("convert-dcp", str(HF_FULL), no_torch=True)
    assert proc.returncode == int(CheckpointError.exit_code)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing to convert" in lines[0], proc.stderr


def test_zstd_compressed_dcp_converts_like_torch_reads_it(converted: dict[str, Any]) -> None:
    assert_same(written(converted, "zstd"), torch_dcp(ZSTD_DCP, converted["scratch"]))


def test_zstd_without_zstandard_is_one_line_saying_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard now raises ImportError
    out = tmp_path / "out"
    with pytest.raises(CheckpointError) as info:
        convert_dcp(ZSTD_DCP, output=out, progress=False)
    line = str(info.value)
    assert "\n" not in line and "zstd" in line and "install zstandard" in line, line
    assert not out.exists()


def test_rank_local_metadata_is_the_union_of_the_ranks(converted: dict[str, Any]) -> None:
    got = written(converted, "rank local")
    assert_same(got, torch_rank_local(RANK_LOCAL_DCP))
    assert torch.equal(got["sharded.weight"], torch.arange(24, dtype=torch.float32).reshape(6, 4))  # both halves


def test_every_dtype_safetensors_holds_is_copied_through(converted: dict[str, Any]) -> None:
    reference = torch_dcp(DTYPES_DCP, converted["scratch"])
    got = written(converted, "dtypes")
    want = {k: v for k, v in reference.items() if k not in UNREPRESENTABLE}
    assert {str(v.dtype) for v in want.values()} >= {
        "torch.complex64",
        "torch.float8_e4m3fnuz",
        "torch.float8_e5m2fnuz",
        "torch.float8_e8m0fnu",
        "torch.uint64",
        "torch.float4_e2m1fn_x2",
    }
    assert_same(got, want)
    notes = converted["results"]["dtypes"]["result"]["notes"]
    for name, dtype in UNREPRESENTABLE.items():
        assert any(name in n and f"cannot hold {dtype}" in n for n in notes), notes


@pytest.mark.parametrize("dtype", list(CAST))
def test_dtype_casts_every_floating_tensor_as_torch_does(converted: dict[str, Any], dtype: str) -> None:
    """``--dtype``: float8 (every byte value, NaNs included), bf16, fp16, fp64 cast as ``tensor.to``; others kept."""
    reference = torch_dcp(DTYPES_DCP, converted["scratch"])
    target = CAST[dtype]
    castable = {k: v.is_floating_point() and v.dtype != torch.float4_e2m1fn_x2 for k, v in reference.items()}
    want = {  # torch defines no cast from float4_e2m1fn_x2 ("copy_kernel" not implemented): kept, as the tool does
        k: (v.to(target) if castable[k] else v).contiguous() for k, v in reference.items() if k not in UNREPRESENTABLE
    }
    got = written(converted, f"dtypes {dtype}")
    if target is torch.bfloat16:
        # torch's own NaN bits for float32/float64 → bfloat16 differ between its vectorized loop (0xFFFF)
        # and its scalar tail (0x7FC0), so there only NaN-ness can be compared; every other value, and
        # every float8 NaN (always 0x7FC0), is compared bit for bit.
        for name in ("f32", "f64"):
            nan = want[name].isnan()
            assert torch.equal(got[name].isnan(), nan), name
            got[name], want[name] = got[name][~nan], want[name][~nan]
    assert_same(got, want)


def _repiece(folder: Path, file: str, offsets: dict[str, list[int]] | None, raw_info: str | None = None) -> None:
    """Rewrite one piece file with safetensors' own writer, its DCP_SHARDING_INFO changed."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    path = folder / file
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
        metadata = dict(f.metadata())
    info = json.loads(metadata["DCP_SHARDING_INFO"])
    for name, value in (offsets or {}).items():
        info[name]["saved_offsets"] = value
    metadata["DCP_SHARDING_INFO"] = raw_info if raw_info is not None else json.dumps(info)
    save_file(tensors, str(path), metadata=metadata)


BAD_PIECES = {
    "sharding info not JSON": (
        lambda d: _repiece(d, "shard-00002-model-00001-of-00001.safetensors", None, "{oops"),
        "not valid JSON",
    ),
    "offsets of the wrong rank": (
        lambda d: _repiece(d, "shard-00002-model-00001-of-00001.safetensors", {"embed.weight": [3]}),
        "no valid saved_offsets",
    ),
    "overlapping pieces": (
        lambda d: _repiece(d, "shard-00002-model-00001-of-00001.safetensors", {"embed.weight": [2, 0]}),
        "overlap",
    ),
    "a piece saved twice": (
        lambda d: shutil.copy(
            d / "shard-00001-model-00001-of-00001.safetensors", d / "shard-00004-model-00001-of-00001.safetensors"
        ),
        "saved twice",
    ),
}


@pytest.mark.parametrize("case", list(BAD_PIECES))
def test_bad_pieces_are_one_line_and_nothing_is_written(tmp_path: Path, case: str) -> None:
    damage, needle = BAD_PIECES[case]
    folder = shutil.copytree(HF_DISTRIBUTED, tmp_path / "pieces")
    damage(folder)
    out = tmp_path / "out"
    with pytest.raises(CheckpointError) as info:
        convert_dcp(folder, output=out, progress=False)
    assert "\n" not in str(info.value) and needle in str(info.value), str(info.value)
    assert not out.exists()


def test_delete_dcp_never_loses_the_tensors_safetensors_cannot_hold(tmp_path: Path) -> None:
    dcp = shutil.copytree(DTYPES_DCP, tmp_path / "model")
    for waive in (False, True):
        with pytest.raises(UsageError, match=r"2 tensors \(c128, c32\).*would be lost"):
            convert_dcp(dcp, output=tmp_path / "out", delete_dcp=True, allow_unresumable=waive, progress=False)
    assert (dcp / ".metadata").is_file() and not (tmp_path / "out").exists()
