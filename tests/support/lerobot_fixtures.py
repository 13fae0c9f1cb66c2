"""The checkpoints LeRobot itself wrote (``fixtures/lerobot/``, see its README and each ``PROVENANCE.md``).

Each run directory holds ``checkpoints/`` as ``lerobot-train`` left it; the DCP runs also hold
``reference/<step>/model.safetensors``, LeRobot's own ``lerobot-convert-dcp`` output. Tests copy
what they modify into ``tmp_path`` and read the rest in place.
"""

from __future__ import annotations

from pathlib import Path

LEROBOT_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lerobot"

# Written by LeRobot main (src/lerobot/common/train_utils.py save_checkpoint).
MAIN_RUNS = ("single", "single-cosine", "ddp", "fsdp-dcp", "fsdp-safetensors_dcp", "hsdp-dcp")
# Written by LeRobot 0.6.1 (lerobot/common/train_utils.py save_checkpoint).
V061_RUNS = ("single", "single-cosine", "ddp", "fsdp")


def main_run(name: str) -> Path:
    return LEROBOT_FIXTURES / "main" / name


def v061_run(name: str) -> Path:
    return LEROBOT_FIXTURES / "v0_6_1" / name


def all_runs() -> list[Path]:
    return [main_run(n) for n in MAIN_RUNS] + [v061_run(n) for n in V061_RUNS]


def run_id(run: Path) -> str:
    return f"{run.parent.name}/{run.name}"
