"""The counters of a step's parts, read for :mod:`ckpt_tools.format.rules.consistency` to compare.

Metadata and a few bytes per parameter, never whole tensors: the Adam ``step`` counters of the
optimizer container the loader chooses (DCP ``optimizer_0/`` or the flat safetensors file) and
the LR scheduler's state. A part that cannot be read gives None: the check that reads it for
the resume reports it.
"""

from __future__ import annotations

from pathlib import Path

from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.dcp.scalars import read_scalars as read_dcp_scalars
from ckpt_tools.errors import CkptError
from ckpt_tools.facts.scheduler_state import read_scheduler_state
from ckpt_tools.format import layout as L
from ckpt_tools.format import manifest
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.param_groups import position_names, split_flat_key
from ckpt_tools.format.record import TrainingStep
from ckpt_tools.format.rules.consistency import AdamSteps, StepCounters, problems, summary
from ckpt_tools.st.header import read_header
from ckpt_tools.st.scalars import read_scalars as read_st_scalars


def read_counters(paths: StepPaths, record: TrainingStep) -> StepCounters:
    """Read the counters of ``paths`` (metadata and a few bytes per parameter, never whole tensors)."""
    return StepCounters(paths, record, _adam_steps(paths), read_scheduler_state(paths))


def inconsistency(paths: StepPaths, record: TrainingStep) -> str | None:
    """One line saying why the parts of ``paths`` do not belong to one step, or None when they do."""
    found = problems(read_counters(paths, record))
    return summary(found) if found else None


def _adam_steps(paths: StepPaths) -> AdamSteps | None:
    """The counters of the optimizer container the loader chooses; None when it is absent or unreadable."""
    chosen = manifest.choose(manifest.optimizer_inputs(), paths)
    if chosen is None:
        return None
    main = chosen.paths(paths)[0]
    try:
        return AdamSteps(main, _dcp_steps(main) if chosen.is_dcp else _flat_steps(main))
    except (CkptError, OSError, ValueError):
        return None  # the optimizer check reports what is wrong with it


def _dcp_steps(directory: Path) -> dict[str, float]:
    index = ChunkIndex.load(directory)
    names = {}
    for fqn, entry in index.tensors.items():
        path = entry.path
        if len(path) >= 4 and path[0] == L.OPTIMIZER_DCP_KEY and path[1] == "state" and path[-1] == "step":
            names[fqn] = ".".join(str(p) for p in path[2:-1])
    values = read_dcp_scalars(index, list(names))
    return {names[fqn]: value for fqn, value in values.items()}


def _flat_steps(file: Path) -> dict[str, float]:
    header = read_header(file)
    if header.problems:
        return {}
    try:
        by_position = position_names(header.metadata, file)
    except CkptError:
        return {}  # the optimizer check reports it
    names = {}
    for key in header.entries:
        param, slot = split_flat_key(key, by_position)
        if slot == "step":
            names[key] = param
    values = read_st_scalars(header, list(names))
    return {names[key]: value for key, value in values.items()}
