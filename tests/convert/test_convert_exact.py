"""convert-dcp output equals torch's own ``dcp_to_torch_save``, bit for bit, on DCP dirs torch wrote.

The inputs come from one 4-rank torchrun launch (tests/support/dcp_writer.py): FSDP2 over 2
and 3 ranks with uneven shards and empty chunks, HSDP 2×2, a 2-D mesh, every dtype, 0-d
scalars, tied weights, a transposed and a zero-size tensor.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ckpt_tools.convert import convert_dcp
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.errors import UsageError
from devtools.procs import run_cli, script
from tests.support.dcp_fixtures import (
    FSDP2_DCP,
    FSDP2_OPT,
    FSDP2_STEP,
    FSDP3_DCP,
    HSDP_DCP,
    HSDP_STEP,
    MODEL_DCPS,
    SHARD2D_DCP,
    copy_tree,
    torch_reference,
    tree_digest,
)

TORCH_DTYPES = {None: None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("refs")


def expected(tensor: torch.Tensor, dtype: str | None) -> torch.Tensor:
    target = TORCH_DTYPES[dtype]
    if target is None or not tensor.is_floating_point():
        return tensor.contiguous()
    return tensor.to(target).contiguous()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.contiguous().view(-1).view(torch.uint8).equal(b.contiguous().view(-1).view(torch.uint8))


def test_the_fixture_exercises_the_hard_layouts(ckpts: Path) -> None:
    """Guard against a vacuous exactness test: uneven, empty, 2-D and 0-d chunks are all there."""
    fsdp3 = ChunkIndex.load(ckpts / FSDP3_DCP)
    assert sorted(c.sizes[0] for c in fsdp3.tensors["model.w"].chunks) == [2, 4, 4]
    assert [c.sizes[0] for c in fsdp3.tensors["model.tiny"].chunks].count(0) == 1
    grid = ChunkIndex.load(ckpts / SHARD2D_DCP).tensors["model.grid"]
    assert len(grid.chunks) == 4 and all(c.sizes != grid.shape[:1] + c.sizes[1:] for c in grid.chunks)
    fsdp2 = ChunkIndex.load(ckpts / FSDP2_DCP)
    assert fsdp2.tensors["model.extras.scalar_f"].shape == ()
    assert {e.dtype for e in fsdp2.tensors.values()} >= {
        "float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"
    }  # fmt: skip
    assert "model.head.weight" in fsdp2.tensors and "model.embed.weight" in fsdp2.tensors
    hsdp = ChunkIndex.load(ckpts / HSDP_DCP)
    # 4 ranks wrote, but each replicated box was saved once: 2 chunks (dp_shard) per tensor.
    assert len(hsdp.ranks()) == 4 and len(hsdp.tensors["model.extras.big"].chunks) == 2


@pytest.mark.parametrize("dcp", MODEL_DCPS)
@pytest.mark.parametrize("dtype", [None, "fp32", "bf16", "fp16"])
def test_matches_dcp_to_torch_save(ckpts: Path, scratch: Path, tmp_path: Path, dcp: str, dtype: str | None) -> None:
    ref = torch_reference(ckpts / dcp, scratch)["model"]
    result = convert_dcp(ckpts / dcp, output=tmp_path, dtype=dtype, progress=False)
    got = load_file(result.output_files[0])
    assert sorted(got) == sorted(ref)
    for name, tensor in ref.items():
        assert same_bits(got[name], expected(tensor, dtype)), name
    assert result.tensor_count == len(ref)


def test_hsdp_conversion_equals_the_gathered_full_state_dict(ckpts: Path, tmp_path: Path) -> None:
    """The same run's rank-0 gathered model.safetensors (full_state_dict) holds the same bytes."""
    out = convert_dcp(ckpts / HSDP_DCP, output=tmp_path, progress=False).output_files[0]
    gathered = load_file(ckpts / HSDP_STEP / "pretrained_model" / "model.safetensors")
    ours = load_file(out)
    assert gathered, "the fixture wrote the gathered weights"
    for name, tensor in gathered.items():
        assert same_bits(ours[name], tensor), name


def test_tied_weights_are_both_written(ckpts: Path, tmp_path: Path) -> None:
    got = load_file(convert_dcp(ckpts / FSDP2_DCP, output=tmp_path, progress=False).output_files[0])
    assert same_bits(got["head.weight"], got["embed.weight"])


@pytest.mark.parametrize("dtype", [None, "bf16"])
def test_max_shard_size_index_maps_every_tensor(ckpts: Path, scratch: Path, tmp_path: Path, dtype: str | None) -> None:
    ref = torch_reference(ckpts / FSDP2_DCP, scratch)["model"]
    limit = 3_000_000
    result = convert_dcp(ckpts / FSDP2_DCP, output=tmp_path, dtype=dtype, max_shard_size="3MB", progress=False)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted({*index["weight_map"].values()})
    assert len(shards) >= 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert set(index["weight_map"]) == set(ref)
    total = 0
    for shard in shards:
        with safe_open(tmp_path / shard, "pt") as f:
            names = list(f.keys())
            sizes = [f.get_tensor(n).nbytes for n in names]
            assert sum(sizes) <= limit or len(names) == 1, shard
            total += sum(sizes)
            for n in names:
                assert index["weight_map"][n] == shard
                assert same_bits(f.get_tensor(n), expected(ref[n], dtype)), n
    assert index["metadata"]["total_size"] == total
    assert {p.name for p in tmp_path.iterdir()} == {*shards, "model.safetensors.index.json"}
    assert [p.name for p in result.output_files][-1] == "model.safetensors.index.json"


def test_accelerate_merge_weights_agrees(ckpts: Path, tmp_path: Path) -> None:
    from accelerate.utils import merge_fsdp_weights  # what `accelerate merge-weights` runs

    theirs = tmp_path / "accelerate"
    merge_fsdp_weights(str(ckpts / FSDP3_DCP), str(theirs), safe_serialization=True)
    ours = convert_dcp(ckpts / FSDP3_DCP, output=tmp_path / "ours", progress=False).output_files[0]
    a, b = load_file(ours), load_file(theirs / "model.safetensors")
    assert sorted(a) == sorted(b)
    for name in a:
        assert same_bits(a[name], b[name]), name


def test_cli_runs_without_torch_and_writes_the_same_bytes(ckpts: Path, tmp_path: Path) -> None:
    api = convert_dcp(ckpts / FSDP2_DCP, output=tmp_path / "api", dtype="bf16", progress=False).output_files[0]
    proc = run_cli(
        "convert-dcp", str(ckpts / FSDP2_STEP), "--output", str(tmp_path / "cli"), "--dtype", "bf16", no_torch=True
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "cli" / "model.safetensors").read_bytes() == api.read_bytes()
    inspected = run_cli("inspect", str(ckpts / FSDP2_STEP), "--json", no_torch=True)
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["healthy"] is True


def test_seed_alias_converts_verifies_and_deletes(ckpts: Path, tmp_path: Path, scratch: Path) -> None:
    import subprocess

    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "000010")
    ref = torch_reference(ckpts / FSDP2_DCP, scratch)["model"]
    proc = subprocess.run(
        [script("lerobot-convert-dcp"), f"--checkpoint_dir={step}", "--delete_dcp=true", "--quiet=true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert not (step / "pretrained_model" / "pytorch_model_fsdp_0").exists()
    got = load_file(step / "pretrained_model" / "model.safetensors")
    assert all(same_bits(got[k], v) for k, v in ref.items())
    assert (step / "training_state" / "optimizer_0" / ".metadata").exists()  # only the model shards go


def test_seed_alias_dry_run_writes_nothing(ckpts: Path, tmp_path: Path) -> None:
    import subprocess

    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "000010")
    before = tree_digest(step)
    proc = subprocess.run(
        [script("lerobot-convert-dcp"), f"--checkpoint_dir={step}/pretrained_model", "--dry_run=true", "--json=true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["dry_run"] is True and plan["plan"]["tensor_count"] == 28
    assert tree_digest(step) == before


def test_optimizer_flattens_to_torch_state(ckpts: Path, scratch: Path, tmp_path: Path) -> None:
    ref = torch_reference(ckpts / FSDP2_OPT, scratch)["optimizer"]
    result = convert_dcp(ckpts / FSDP2_STEP, what="optimizer", output=tmp_path, progress=False)
    path = result.output_files[0]
    assert path.name == "optimizer_state_flat.safetensors"
    got = load_file(path)
    expected_names = {f"state.{p}.{k}" for p, entries in ref["state"].items() for k in entries}
    assert set(got) == expected_names
    for param, entries in ref["state"].items():
        for key, value in entries.items():
            assert same_bits(got[f"state.{param}.{key}"], value), (param, key)
    with safe_open(path, "pt") as f:
        groups = json.loads(f.metadata()["param_groups"])
    assert groups[0]["lr"] == ref["param_groups"][0]["lr"]
    assert groups[0]["params"] == ref["param_groups"][0]["params"]
    assert groups[0]["betas"] == list(ref["param_groups"][0]["betas"])


def test_existing_output_needs_overwrite(ckpts: Path, tmp_path: Path) -> None:
    convert_dcp(ckpts / FSDP3_DCP, output=tmp_path, progress=False)
    first = (tmp_path / "model.safetensors").read_bytes()
    with pytest.raises(UsageError, match="already exists"):
        convert_dcp(ckpts / FSDP3_DCP, output=tmp_path, dtype="bf16", progress=False)
    assert (tmp_path / "model.safetensors").read_bytes() == first
    convert_dcp(ckpts / FSDP3_DCP, output=tmp_path, dtype="bf16", overwrite=True, progress=False)
    assert load_file(tmp_path / "model.safetensors")["w"].dtype == torch.bfloat16
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # no temporaries left


def test_default_output_is_next_to_the_shards_and_delete_needs_verification(ckpts: Path, tmp_path: Path) -> None:
    step = copy_tree(ckpts / FSDP2_STEP, tmp_path / "step")
    result = convert_dcp(step, delete_dcp=True, progress=False)
    assert result.output_files == (step / "pretrained_model" / "model.safetensors",)
    assert result.verified and result.deleted_dcp
    assert not (step / "pretrained_model" / "pytorch_model_fsdp_0").exists()
    shutil.rmtree(step)
