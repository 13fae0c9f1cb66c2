"""Real, small checkpoint folders for the Hub tests (no torch: weights via ``safetensors.numpy``).

The step directory has the full shape of docs/checkpoint-format.md - gathered weights and processors next to
DCP shard directories, a ``training_state/`` with optimizer shards - plus the litter a
crashed save leaves (a hidden temporary) and an unrelated file, so a test can prove that
exactly the publishable files, and nothing else, reach the Hub.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from ckpt_tools.format import layout
from ckpt_tools.format.record import SamplerPosition, Topology, TrainingStep, training_step_json

STEP = 5000


@dataclass(frozen=True)
class StepDir:
    root: Path  # checkpoints/005000
    checkpoints: Path
    dataset_root: Path  # absolute local path recorded in train_config.json (must never reach the card)
    output_dir: Path

    @property
    def pretrained_model(self) -> Path:
        return self.root / layout.PRETRAINED_MODEL_DIR

    @property
    def training_state(self) -> Path:
        return self.root / layout.TRAINING_STATE_DIR


# What a push of the step dir must upload (besides a generated README.md), by name.
PUBLISHED = (
    "config.json",
    "model.safetensors",
    "policy_preprocessor.json",
    "policy_preprocessor_step_0_normalizer.safetensors",
    "train_config.json",
)
PUBLISHED_PEFT = (
    "adapter_config.json",
    "adapter_model.safetensors",
    "config.json",
    "train_config.json",
)


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "encoder.layers.0.linear.weight": rng.standard_normal((64, 32)).astype(np.float32),
        "encoder.layers.0.linear.bias": rng.standard_normal((64,)).astype(np.float32),
        "decoder.head.weight": rng.standard_normal((8, 64)).astype(np.float32),
    }


def train_config(dataset_root: Path, output_dir: Path, *, peft: bool = False, **overrides: object) -> dict:
    config: dict = {
        "dataset": {"repo_id": "alice/pick-place", "root": str(dataset_root), "revision": None},
        "policy": {"type": "act", "path": None, "repo_id": "alice/act-pick-place", "private": False, "dim_model": 64},
        "output_dir": str(output_dir),
        "job_name": "act_pick_place",
        "seed": 1000,
        "steps": STEP,
        "batch_size": 8,
        "save_freq": 1000,
        "checkpoint_format": "safetensors_dcp",
        "parallelism": {"dp_replicate": 2, "dp_shard": 2},
        "accelerator": {"mixed_precision": "bf16", "gradient_accumulation": {"steps": 2}},
        "peft": {"method_type": "LORA", "r": 8, "lora_alpha": None} if peft else None,
    }
    config.update(overrides)
    return config


def make_step_dir(base: Path, *, peft: bool = False, with_training_step: bool = True) -> StepDir:
    """``base/run/checkpoints/005000`` (+ ``last``), shaped like an HSDP 2×2 safetensors_dcp save."""
    output_dir = base / "run"
    checkpoints = output_dir / layout.CHECKPOINTS_DIR
    root = checkpoints / layout.step_dir_name(STEP)
    pm = root / layout.PRETRAINED_MODEL_DIR
    ts = root / layout.TRAINING_STATE_DIR
    dataset_root = base / "datasets" / "my_local_pick_place"
    for d in (pm / layout.MODEL_DCP_DIR, ts / layout.OPTIMIZER_DCP_DIR, dataset_root):
        d.mkdir(parents=True, exist_ok=True)

    _write_json(pm / layout.POLICY_CONFIG, {"type": "act", "dim_model": 64, "chunk_size": 10})
    _write_json(pm / layout.TRAIN_CONFIG, train_config(dataset_root, output_dir, peft=peft))
    if peft:
        save_file(weights(1), str(pm / layout.ADAPTER_WEIGHTS))
        base_model = base / "models" / "act_base"  # a local base model: its path must not reach the card
        _write_json(
            pm / layout.ADAPTER_CONFIG, {"peft_type": "LORA", "r": 8, "base_model_name_or_path": str(base_model)}
        )
    else:
        save_file(weights(0), str(pm / layout.MODEL_WEIGHTS), metadata={"format": "pt"})
        _write_json(pm / f"{layout.PREPROCESSOR}.json", {"steps": [{"registry_name": "normalizer"}]})
        stats = {"observation.state.mean": np.zeros(6, np.float32), "observation.state.std": np.ones(6, np.float32)}
        save_file(stats, str(pm / f"{layout.PREPROCESSOR}_step_0_normalizer.safetensors"))

    # DCP shards (real files with DCP names; never to be uploaded) and a crashed save's hidden temporary.
    for rank in range(2):
        (pm / layout.MODEL_DCP_DIR / f"__{rank}_0{layout.DCP_SHARD_SUFFIX}").write_bytes(os.urandom(512))
        (ts / layout.OPTIMIZER_DCP_DIR / f"__{rank}_0{layout.DCP_SHARD_SUFFIX}").write_bytes(os.urandom(512))
    (pm / layout.MODEL_DCP_DIR / layout.DCP_METADATA).write_bytes(b"\x80\x04metadata")
    (ts / layout.OPTIMIZER_DCP_DIR / layout.DCP_METADATA).write_bytes(b"\x80\x04metadata")
    (pm / ".model.safetensors.x1y2.tmp").write_bytes(b"partial")
    (pm / "notes.txt").write_text("not for the Hub\n")
    save_file({"state": np.arange(4, dtype=np.int64)}, str(ts / layout.RNG_STATE))
    _write_json(ts / layout.SCHEDULER_STATE, {"last_epoch": STEP})
    if with_training_step:
        record = TrainingStep(
            step=STEP,
            samples_seen=STEP * 32,
            dp_world_size=4,
            batch_size=8,
            grad_accum_steps=2,
            mixed_precision="bf16",
            checkpoint_format="safetensors_dcp",
            topology=Topology(world_size=4, dp_replicate=2, dp_shard=2, nnodes=1),
            sampler=SamplerPosition(epoch=3, offset=64, seed=1000),
            sharded=True,
            peft=peft,
            versions={"ckpt_tools": "0.1.0", "torch": "2.13.0"},
        )
        (ts / layout.TRAINING_STEP).write_text(training_step_json(record))
    (checkpoints / layout.LAST_LINK).symlink_to(root.name)
    return StepDir(root, checkpoints, dataset_root, output_dir)


def tree_digest(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root`` (links as their target), to prove nothing changed."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs:
            if (Path(dirpath) / name).is_symlink():
                out[str((Path(dirpath) / name).relative_to(root))] = "link:" + os.readlink(Path(dirpath) / name)
        for name in files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            out[rel] = "link:" + os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def assert_published_as_local(published: dict[str, bytes], step: StepDir) -> None:
    """The published files of a weights push are the step's own bytes - but for ``train_config.json``,
    published as a copy whose local paths (``dataset.root``, ``output_dir``) are null."""
    for name in PUBLISHED:
        local = (step.pretrained_model / name).read_bytes()
        if name != layout.TRAIN_CONFIG:
            assert published[name] == local, name
            continue
        expected = json.loads(local)
        expected["dataset"]["root"] = None
        expected["output_dir"] = None
        assert json.loads(published[name]) == expected
