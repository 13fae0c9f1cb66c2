"""The rules that decide how a run starts and resumes, defined once for the trainer and the tools.

- :mod:`.startup`: the start-up refusals and the data-parallel mesh a launch builds;
- :mod:`.resumable`: whether a checkpoint's layout can be resumed at all, and bit-exactly
  (:func:`ckpt_tools.facts.resumable.unresumable_reason` reads what it needs from the files);
- :mod:`.data_order`: whether a resume is sample-exact;
- :mod:`.scaling`: the linear-scaling suggestion for lr and steps;
- :mod:`.ignored_modules`: which modules ``--accelerator.fsdp.ignored_modules`` keeps unsharded.

None of them needs torch: the trainer calls them on its config, ``reshard-plan`` and
``verify-resume`` on a checkpoint's saved config merged with their flags.
"""

from __future__ import annotations

from ckpt_tools.format.rules.data_order import DataOrderChange
from ckpt_tools.format.rules.resumable import master_copy_problem
from ckpt_tools.format.rules.scaling import LinearScaling, linear_scaling
from ckpt_tools.format.rules.startup import (
    MIXED_PRECISION_CHOICES,
    Refusal,
    RunSettings,
    resolve_parallelism,
    setting_refusals,
    world_refusals,
)

__all__ = [
    "MIXED_PRECISION_CHOICES",
    "DataOrderChange",
    "LinearScaling",
    "Refusal",
    "RunSettings",
    "linear_scaling",
    "master_copy_problem",
    "resolve_parallelism",
    "setting_refusals",
    "world_refusals",
]
