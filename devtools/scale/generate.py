"""A whole step directory, generated: ``<out>/checkpoints/<step>/`` and ``last``, as the trainer commits one.

Like the trainer's save, everything goes into the hidden ``.<step>.partial/`` first (which is
also the ``checkpoint_id`` DCP records), the model's DCP directory, then the optimizer's, then
the sidecars, ``training_step.json`` last; then the directory is renamed into place and
``last`` moved. Each DCP directory also gets the chunk index the trainer writes beside
``.metadata`` - when this checkout's trainer writes one, unless ``index`` says otherwise (a
checkpoint from another producer has none). The two DCP directories are generated one after the other, so memory peaks at
the larger one's metadata objects. Before anything is written, the disk must hold what the
sparse files will take (about two pages per chunk: its archive's head and tail).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ckpt_tools.format import layout
from ckpt_tools.format.rules import save_files
from ckpt_tools.io.fsutil import replace_symlink
from devtools.scale import run as runs
from devtools.scale import sizes, trainer_index
from devtools.scale.archives import Templates
from devtools.scale.dcp_dir import DcpStats, write_dcp_dir
from devtools.scale.shapes import LlamaShape
from devtools.scale.sidecars import write_pretrained_model, write_training_state
from devtools.scale.state import model_items, optimizer_items
from devtools.scale.trainer_index import NoIndexWriter
from devtools.scale.world import World


class GenerationRefused(Exception):
    """The generation cannot be done here (one line: why)."""


@dataclass(frozen=True)
class Recipe:
    """What to generate: the model, the world it was saved from, and how the trainer's writer was set."""

    shape: LlamaShape
    world: World
    threads: int = 4  # DCP writer threads per rank: the trainer's on a node with >= 4 cores per local rank
    crc32: bool = False  # the trainer turns torch.save's per-record CRC32 off
    shards: bool = True  # False: .metadata only, no shard files
    # The chunk index the trainer writes beside each .metadata; None: as this checkout's trainer does.
    index: bool | None = None
    run: runs.TrainingRun = field(default_factory=runs.TrainingRun)

    def label(self) -> str:
        return f"{self.shape.name}-{self.world.label()}"


@dataclass(frozen=True)
class Generated:
    """What a generation wrote, and how long it took (the process's start-up excluded)."""

    step_dir: Path
    model: DcpStats
    optimizer: DcpStats
    seconds: float

    @property
    def chunks(self) -> int:
        return self.model.chunks + self.optimizer.chunks

    @property
    def metadata_bytes(self) -> int:
        return self.model.metadata_bytes + self.optimizer.metadata_bytes


def chunk_count(recipe: Recipe) -> int:
    return sizes.chunk_count(recipe.shape, recipe.world)


def disk_needed(recipe: Recipe) -> int:
    return sizes.disk_needed(recipe.shape, recipe.world, recipe.shards)


def generate(out: Path, recipe: Recipe, *, overwrite: bool = False) -> Generated:
    """Write ``out/checkpoints/<step>/`` (and ``last``) for ``recipe``; refuse in one line when it cannot."""
    started = time.perf_counter()
    out = out.resolve()
    checkpoints = out / layout.CHECKPOINTS_DIR
    name = layout.step_dir_name(recipe.run.step, recipe.run.steps)
    final, partial = checkpoints / name, checkpoints / layout.partial_dir_name(name)
    if final.exists() and not overwrite:
        raise GenerationRefused(f"{final}: already there (pass --overwrite to generate it again)")
    checkpoints.mkdir(parents=True, exist_ok=True)
    needed, free = disk_needed(recipe), shutil.disk_usage(checkpoints).free
    if needed + sizes.DISK_MARGIN > free:
        raise GenerationRefused(
            f"{checkpoints}: {free / 2**30:.1f} GiB free, {recipe.label()} needs about {needed / 2**30:.1f} GiB"
            f" of sparse shard files ({chunk_count(recipe):,} chunks) plus 1 GiB to spare; try --metadata-only"
        )
    shutil.rmtree(partial, ignore_errors=True)
    try:
        return _generate(recipe, out, checkpoints, name, started)
    except NoIndexWriter as e:
        shutil.rmtree(partial, ignore_errors=True)
        raise GenerationRefused(f"--index: {e}") from None


def _generate(recipe: Recipe, out: Path, checkpoints: Path, name: str, started: float) -> Generated:
    final, partial = checkpoints / name, checkpoints / layout.partial_dir_name(name)
    cfg = runs.train_config(recipe.world, recipe.run, out)
    templates = Templates(recipe.crc32)
    pretrained, training = partial / layout.PRETRAINED_MODEL_DIR, partial / layout.TRAINING_STATE_DIR
    model = _dcp(pretrained / layout.MODEL_DCP_DIR, model_items(recipe.shape), recipe, templates)
    optimizer_state = runs.optimizer_state(recipe.shape, cfg, recipe.run.step)
    items = optimizer_items(recipe.shape, optimizer_state, recipe.run.step, recipe.crc32)
    optimizer = _dcp(training / layout.OPTIMIZER_DCP_DIR, items, recipe, templates)
    write_pretrained_model(pretrained, recipe.shape, runs.train_config_json(recipe.shape, cfg), recipe.run.dataset_root)
    record = runs.training_step(recipe.world, recipe.run, runs.dataset_size(recipe.run.dataset_root), cfg.seed)
    save_id = save_files.new_save_id()
    write_training_state(training, record, optimizer_state.scheduler, cfg.seed, save_id)
    steps = layout.StepPaths(partial)  # the record of the save's files, as the trainer's commit writes it
    save_files.write_record(steps, save_id, full=False)  # no full digests: they would read every sparse byte
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    replace_symlink(checkpoints / layout.LAST_LINK, name)
    return Generated(final, model, optimizer, time.perf_counter() - started)


def _dcp(directory: Path, items: list, recipe: Recipe, templates: Templates) -> DcpStats:
    return write_dcp_dir(
        directory, items, recipe.world, threads=recipe.threads, templates=templates, checkpoint_id=directory,
        shards=recipe.shards, index=trainer_index.available() if recipe.index is None else recipe.index,
    )  # fmt: skip
