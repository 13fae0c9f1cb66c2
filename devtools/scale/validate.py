"""The generator checked against torch: a real save and a generated one, compared case by case.

:func:`real_checkpoints` launches :mod:`devtools.scale.real_save` under torchrun (4 gloo
processes on CPU); :func:`differences_from_torch` generates each case with the same model,
world, writer threads and run, and compares the two DCP directories of every case
(:func:`devtools.scale.compare.differences`). Put the two roots at paths of equal length
(``.../real`` and ``.../made``): ``.metadata`` records the directory it was written into, so
only then can its size be compared too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ckpt_tools.format import layout
from devtools.procs import kill_tree, launch_env, torchrun_command
from devtools.scale.cases import CASES, LAUNCH_RANKS, RUN
from devtools.scale.compare import differences
from devtools.scale.generate import Recipe, generate
from devtools.scale.shapes import TINY

WORKER = Path(__file__).with_name("real_save.py")


def real_checkpoints(out: Path, timeout: float = 300) -> Path:
    """``out/<case>/checkpoints/<step>/``, saved by torch under torchrun."""
    command = torchrun_command(str(WORKER), [str(out)], nproc=LAUNCH_RANKS)
    env = launch_env({"PYTHONWARNINGS": "ignore"})
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)  # torchrun's workers live in their own sessions
        proc.communicate()
        raise RuntimeError(f"real_save did not finish in {timeout:.0f} s") from None
    if not (out / "DONE").exists():
        raise RuntimeError(f"real_save failed (rc {proc.returncode}):\n{stderr[-4000:]}")
    return out


def differences_from_torch(real: Path, made: Path) -> dict[str, list[str]]:
    """Per case and DCP directory, what the generated checkpoint does differently (all empty: none)."""
    out = {}
    step = layout.step_dir_name(RUN.step, RUN.steps)
    for case in CASES:
        generated = generate(made / case.label, Recipe(TINY, case.world, case.threads, run=RUN), overwrite=True)
        for part in (
            Path(layout.PRETRAINED_MODEL_DIR) / layout.MODEL_DCP_DIR,
            Path(layout.TRAINING_STATE_DIR) / layout.OPTIMIZER_DCP_DIR,
        ):
            saved = real / case.label / layout.CHECKPOINTS_DIR / step / part
            out[f"{case.label}/{part.name}"] = differences(saved, generated.step_dir / part)
    return out
