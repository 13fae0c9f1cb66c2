"""The generator at a small real scale, in-process: a Llama 2 7B FSDP checkpoint over 8 ranks.

torch reads it (its ``.metadata``, and tensors through ``dcp.load``: zeros from the holes, the
real Adam counters), the project's torch-free reader finds it whole, and the tools call it
healthy and resumable, on its own topology and on half of it. The check against a real
``dcp.save`` is ``test_real_save.py``'s.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from ckpt_tools.dcp import validate
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.format import layout as L
from devtools.scale.generate import GenerationRefused, Recipe, chunk_count, generate
from devtools.scale.shapes import MODELS, TINY
from devtools.scale.states import dcp_dirs
from devtools.scale.world import World, shard_box
from tests.support.cli import invoke_cli

LLAMA_7B = MODELS["7b"]


@pytest.fixture(scope="module")
def step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = generate(tmp_path_factory.mktemp("llama7b"), Recipe(LLAMA_7B, World.of("fsdp", 8)))
    assert made.step_dir.name == "000100" and (made.step_dir.parent / L.LAST_LINK).resolve() == made.step_dir
    return made.step_dir


def test_torch_reads_the_metadata(step: Path) -> None:
    model = FileSystemReader(step / "pretrained_model" / L.MODEL_DCP_DIR).read_metadata()
    assert len(model.state_dict_metadata) == len(LLAMA_7B.parameters()) == 291
    wk = model.state_dict_metadata["model.layers.0.attention.wk.weight"]
    assert wk.properties.dtype == torch.float32 and tuple(wk.size) == (4096, 4096)
    assert [(c.offsets[0], c.sizes[0]) for c in wk.chunks] == [(512 * r, 512) for r in range(8)]
    assert model.planner_data["model.output.weight"] == ("model", "output.weight")
    optimizer = FileSystemReader(step / "training_state" / L.OPTIMIZER_DCP_DIR).read_metadata()
    groups = [k for k, v in optimizer.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)]
    assert len(optimizer.state_dict_metadata) == 3 * 291 + len(groups) and "optimizer.param_groups.0.lr" in groups


def test_torch_loads_tensors_from_the_sparse_files(step: Path) -> None:
    norm = torch.full((4096,), 7.0)
    moment, counter = torch.full((4096,), 7.0), torch.tensor(0.0)
    dcp.load({"model": {"norm.weight": norm}}, checkpoint_id=step / "pretrained_model" / L.MODEL_DCP_DIR,
             planner=DefaultLoadPlanner(allow_partial_load=True), no_dist=True)  # fmt: skip
    state = {"optimizer": {"state": {"norm.weight": {"exp_avg": moment, "step": counter}}}}
    dcp.load(state, checkpoint_id=step / "training_state" / L.OPTIMIZER_DCP_DIR,
             planner=DefaultLoadPlanner(allow_partial_load=True), no_dist=True)  # fmt: skip
    assert not norm.any() and not moment.any() and counter.item() == 100.0
    shard = step / "training_state" / L.OPTIMIZER_DCP_DIR / "__0_0.distcp"
    assert shard.stat().st_blocks * 512 < shard.stat().st_size / 1000  # holes, not data


def test_the_torch_free_reader_finds_it_whole(step: Path) -> None:
    for part in (Path("pretrained_model") / L.MODEL_DCP_DIR, Path("training_state") / L.OPTIMIZER_DCP_DIR):
        index = ChunkIndex.load(step / part)
        assert validate.problems(index) == []
        assert len(index.ranks()) == 8 and all(len(r.files) == 4 for r in index.ranks())


def test_the_tools_call_it_healthy_and_resumable_but_for_its_policy(step: Path) -> None:
    """Every check passes but one: ckpt-train builds no Llama (the generated config's policy), and says so."""
    assert invoke_cli("inspect", str(step)).returncode == 0
    for extra in ([], ["--nproc", "4", "--dp-shard", "4"]):
        proc = invoke_cli("verify-resume", str(step), *extra)
        failed = [line for line in proc.stdout.splitlines() if line.lstrip().startswith("FAIL")]
        assert proc.returncode == 1 and len(failed) == 1, proc.stdout
        assert "config-builds" in failed[0] and "'llama'" in failed[0], failed


def test_metadata_only(tmp_path: Path) -> None:
    made = generate(tmp_path, Recipe(LLAMA_7B, World.of("hsdp", 16), shards=False))
    directory = made.step_dir / "pretrained_model" / L.MODEL_DCP_DIR
    assert (directory / L.DCP_METADATA).is_file() and not list(directory.glob(f"*{L.DCP_SHARD_SUFFIX}"))
    assert made.chunks == chunk_count(Recipe(LLAMA_7B, World(2, 8)))
    found = validate.problems(ChunkIndex.load(directory))
    assert found and "missing" in validate.summary(found)


def test_refuses_in_one_line_when_the_disk_cannot_hold_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("devtools.scale.sizes.DISK_PER_CHUNK", 2**50)
    with pytest.raises(GenerationRefused, match=r"GiB free, llama2-7b-fsdp8 needs about .* --metadata-only$"):
        generate(tmp_path, Recipe(LLAMA_7B, World.of("fsdp", 8)))
    assert not (tmp_path / "checkpoints" / "000100").exists()


def test_with_the_index_the_trainer_writes(tmp_path: Path) -> None:
    pytest.importorskip("ckpt_tools.train.checkpoint.save_index", reason="this checkout writes no chunk index yet")
    made = generate(tmp_path, Recipe(TINY, World(1, 4), index=True))
    for directory in dcp_dirs(made.step_dir):
        assert (directory / L.DCP_INDEX).is_file()
    assert invoke_cli("inspect", str(made.step_dir)).returncode == 0


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 13, 4096])
@pytest.mark.parametrize("shards", [1, 3, 4, 8])
def test_shards_follow_torch_chunk(rows: int, shards: int) -> None:
    sizes = [len(c) for c in torch.arange(rows).chunk(shards)]
    sizes += [0] * (shards - len(sizes))
    boxes = [shard_box(rows, shards, s) for s in range(shards)]
    assert [n for _, n in boxes] == sizes
    assert all(start == min(rows, sum(sizes[:s])) for s, (start, _) in enumerate(boxes))


def test_chunk_count_counts_one_box_for_all_empty_shards() -> None:
    # TINY's 2 k/v rows over 4 shards: two rows and one shared empty box, three chunks each
    recipe = Recipe(TINY, World(1, 4))
    per_layer = 4 + 3 + 3 + 4 + 4 + 4 + 4 + 4 + 4  # wq 8 rows, wk/wv 2, wo 8, w1 10, w2 8, w3 10, norms 8
    assert chunk_count(recipe) == 3 * (4 + TINY.n_layers * per_layer + 4 + 4) + len(TINY.parameters())
