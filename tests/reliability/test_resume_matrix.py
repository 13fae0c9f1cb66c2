"""The resume matrix: {1 process, DDP 2, FSDP 2, HSDP 2×2} saved × the same set resumed (docs/reliability.md).

Every cell resumes a real checkpoint of step 4 on another (or the same) topology with
``--steps=4`` into a fresh output dir: the trainer loads the state, has no step left to run,
and saves the restored state at once. Comparing what it saved with what it loaded checks
model and optimizer state after load without a hook into the trainer: the gathered weights
must equal the source's weights, every Adam slot its source slot, and the hyper-parameters,
scheduler state and data position must come through unchanged. Sources cover every
``--checkpoint_format`` that applies to their layout (non-sharded runs save safetensors only),
so each loader path - flat file into shards, DCP into one process, DCP across meshes - runs.

CI runs a representative slice (set ``CKPT_RESUME_MATRIX=full`` for all 32 cells; the
report script does); the existing resume tests already cover FSDP→FSDP, FSDP→1, FSDP→HSDP
and HSDP→FSDP.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from devtools.training import (
    TINY,
    assert_tensors_equal,
    dcp_to_dict,
    flat_optimizer_by_name,
    ok,
    step_dir,
    train,
    unstamped_json,
)

RUN = [*TINY, "--steps=8", "--save_freq=4", "--log_samples=true"]  # the `runs` fixture's flags
FULL = os.environ.get("CKPT_RESUME_MATRIX", "") == "full"


@dataclass(frozen=True)
class Layout:
    nproc: int
    flags: tuple[str, ...]
    batch: tuple[str, ...] = ()


LAYOUTS = {
    "1proc": Layout(1, ("--parallelism.dp_replicate=1", "--parallelism.dp_shard=1")),
    "ddp": Layout(2, ("--parallelism.dp_replicate=1", "--parallelism.dp_shard=1")),
    "fsdp": Layout(2, ("--parallelism.dp_replicate=1", "--parallelism.dp_shard=2")),
    "hsdp": Layout(4, ("--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"), ("--batch_size=4",)),
}
SOURCE_FORMATS = {
    "1proc": ("safetensors",),
    "ddp": ("safetensors",),
    "fsdp": ("safetensors", "dcp", "safetensors_dcp"),
    "hsdp": ("safetensors", "dcp", "safetensors_dcp"),
}
FIXTURE_SOURCES = {("ddp", "safetensors"): "ddp", ("fsdp", "safetensors_dcp"): "fsdp", ("hsdp", "dcp"): "hsdp"}
CI_CELLS = [
    ("ddp", "safetensors", "hsdp"),  # flat files (model and optimizer) onto a 2-D mesh of FSDP shards
    ("hsdp", "dcp", "ddp"),  # DCP shards of a 2-D mesh into full replicas
    ("hsdp", "dcp", "1proc"),  # ... and into one process
]
ALL_CELLS = [(src, fmt, dst) for src, fmts in SOURCE_FORMATS.items() for fmt in fmts for dst in LAYOUTS]


@pytest.fixture(scope="module")
def sources(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Step-4 checkpoints for every (layout, format) the matrix uses: the session's runs, plus
    the few it lacks, trained with the same flags."""
    needed = {(src, fmt) for src, fmt, _ in (ALL_CELLS if FULL else CI_CELLS)}
    root = tmp_path_factory.mktemp("matrix-sources")
    out = {}
    for src, fmt in sorted(needed):
        if (src, fmt) in FIXTURE_SOURCES:
            out[(src, fmt)] = step_dir(runs[FIXTURE_SOURCES[(src, fmt)]], 4)
            continue
        layout = LAYOUTS[src]
        run = root / f"{src}-{fmt}"
        fmt_flag = (f"--checkpoint_format={fmt}",) if src in ("fsdp", "hsdp") else ()
        ok(train(*RUN, "--steps=4", *layout.flags, *layout.batch, *fmt_flag, f"--output_dir={run}", nproc=layout.nproc))
        out[(src, fmt)] = step_dir(run, 4)
    return out


def model_state(step: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """The weights a checkpoint holds: DCP shards when present (what a resume loads), else the file."""
    if (step / "pretrained_model/pytorch_model_fsdp_0/.metadata").exists():
        return dcp_to_dict(step / "pretrained_model/pytorch_model_fsdp_0", tmp)["model"]
    return load_file(str(step / "pretrained_model/model.safetensors"))


def optimizer_state(step: Path, tmp: Path) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """Adam slots as ``state.<param>.<slot>`` and the param groups without their parameter lists."""
    ts = step / "training_state"
    if (ts / "optimizer_0/.metadata").exists():
        osd = dcp_to_dict(ts / "optimizer_0", tmp)["optimizer"]
        slots = {f"state.{name}.{k}": v for name, state in osd["state"].items() for k, v in state.items()}
        groups = osd["param_groups"]
    else:
        slots = flat_optimizer_by_name(step)
        groups = json.loads((ts / "optimizer_param_groups.json").read_text())
    hyper = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"} for g in groups]
    return slots, hyper


def record(step: Path) -> dict[str, Any]:
    data = json.loads((step / "training_state/training_step.json").read_text())
    return {k: data[k] for k in ("step", "samples_seen", "optimizer_steps")}


def _cells() -> list[Any]:
    cells = ALL_CELLS if FULL else CI_CELLS
    return [pytest.param(*cell, id=f"{cell[0]}[{cell[1]}]->{cell[2]}") for cell in cells]


@pytest.mark.torchrun
@pytest.mark.parametrize(("src", "fmt", "dst"), _cells())
def test_state_after_load_equals_the_saved_state(
    sources: dict[tuple[str, str], Path], tmp_path: Path, src: str, fmt: str, dst: str
) -> None:
    source = sources[(src, fmt)]
    target = LAYOUTS[dst]
    save_fmt = "safetensors_dcp" if dst in ("fsdp", "hsdp") else "safetensors"  # gathered weights + its optimizer form
    out = tmp_path / "resumed"
    proc = ok(
        train(
            "--resume=true",
            f"--config_path={source}",
            f"--output_dir={out}",
            "--steps=4",
            *target.flags,
            f"--checkpoint_format={save_fmt}",
            nproc=target.nproc,
        )
    )
    assert f"resumed from {source.resolve()} at step 4" in proc.stdout
    restored = step_dir(out, 4)
    assert_tensors_equal(load_file(str(restored / "pretrained_model/model.safetensors")), model_state(source, tmp_path))
    got_slots, got_groups = optimizer_state(restored, tmp_path)
    want_slots, want_groups = optimizer_state(source, tmp_path)
    assert_tensors_equal(got_slots, want_slots)
    assert got_groups == want_groups
    scheduler = "training_state/scheduler_state.json"  # each stamped with its own save's id
    assert unstamped_json(restored / scheduler) == unstamped_json(source / scheduler)
    assert record(restored) == record(source)
    topology = json.loads((restored / "training_state/training_step.json").read_text())["topology"]
    assert topology["world_size"] == target.nproc
