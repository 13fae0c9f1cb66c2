"""The pristine checkpoints every case starts from, made (or found) once per campaign.

A base is a real run: ``ckpt-train`` on the shipped fixture dataset with the TINY flags, 4 steps
and a save every 2, so that step 2 (the one cases resume from) has a neighbouring later step
(4) in the same run, and a *sibling* - the same flags with another seed - whose step 2 has the
same names, shapes and counters but other contents. Cases copy from here; nothing here is
ever changed. LeRobot's own fixtures are bases too: their resume belongs to ``lerobot-train``,
which this environment may not have.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from devtools.procs import REPO
from devtools.training import TINY, ok, step_dir, train

LEROBOT_FIXTURES = REPO / "fixtures" / "lerobot"
RESUME_STEP = 2  # the step every case resumes from
FINAL_STEP = 4  # --steps of the bases and of every resume (RESUME_STEP + 2): same cosine schedule
RUN_FLAGS = [*TINY, f"--steps={FINAL_STEP}", "--save_freq=2"]
SIBLING_SEED = "--seed=7"

# name -> (processes, extra flags). The multi-process ones are FSDP2 over 2 ranks on gloo.
TRAINER_BASES: dict[str, tuple[int, list[str]]] = {
    "single": (1, []),
    "fsdp_dcp": (2, ["--parallelism.dp_shard=2", "--checkpoint_format=dcp"]),
    "fsdp_stdcp": (2, ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors_dcp"]),
}
# name -> fixture run directory (written by LeRobot main or 0.6.1, see fixtures/lerobot/README.md).
LEROBOT_BASES: dict[str, Path] = {
    "lerobot_main_single": LEROBOT_FIXTURES / "main" / "single",
    "lerobot_main_fsdp_dcp": LEROBOT_FIXTURES / "main" / "fsdp-dcp",
    "lerobot_v061_single": LEROBOT_FIXTURES / "v0_6_1" / "single",
}


@dataclass(frozen=True)
class Base:
    """One pristine run to copy cases from."""

    name: str
    run: Path  # holds checkpoints/
    nproc: int
    trainer: str  # "ckpt-train" or "lerobot"
    sibling: Path | None = None  # another run of the same config (another seed)
    step: int = RESUME_STEP

    def step_dir(self, step: int | None = None) -> Path:
        return step_dir(self.run, self.step if step is None else step)

    @property
    def later(self) -> Path:
        """The neighbouring later step of the same run."""
        return self.step_dir(FINAL_STEP)

    def sibling_step(self) -> Path | None:
        return step_dir(self.sibling, self.step) if self.sibling else None


def build_trainer_base(name: str, root: Path, sibling: bool = True, timeout: float = 300) -> Base:
    """Train the base run and (unless ``sibling`` is false) its sibling under ``root``: real launches."""
    nproc, flags = TRAINER_BASES[name]
    run, other = root / name, root / f"{name}-sibling"
    launches = [(run, []), (other, [SIBLING_SEED])] if sibling else [(run, [])]
    for out, extra in launches:
        if not (step_dir(out, FINAL_STEP) / "training_state" / "save_files.json").is_file():
            ok(train(*RUN_FLAGS, *flags, *extra, f"--output_dir={out}", nproc=nproc, timeout=timeout))
    return Base(name, run, nproc, "ckpt-train", other if sibling else None)


def lerobot_base(name: str) -> Base:
    """A LeRobot fixture run as a base (read in place, only ever copied)."""
    run = LEROBOT_BASES[name]
    nproc = 2 if "fsdp" in name or "ddp" in name else 1
    return Base(name, run, nproc, "lerobot")


def build_bases(root: Path, names: list[str]) -> dict[str, Base]:
    out = {}
    for name in names:
        out[name] = build_trainer_base(name, root) if name in TRAINER_BASES else lerobot_base(name)
    return out
