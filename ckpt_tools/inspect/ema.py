"""What ``inspect`` says about a step's EMA weights: which forms hold them, and whether they fit the live model.

A ``--ema.enable=true`` step holds the shadow as ``pretrained_model_ema/model.safetensors``
(gathered: LeRobot's and ckpt-train's), ``pretrained_model_ema/pytorch_model_fsdp_0/`` (ckpt-train's
sharded runs) and/or ``training_state/ema_state.pt`` (diffusers' state, LeRobot's and
ckpt-train's unsharded runs; read through the restricted reader, :mod:`ckpt_tools.facts.ema_state`).
Each form is compared with the live weights in ``pretrained_model/``: the same tensor names,
shapes and dtypes. A tensor missing or extra, or a shape or dtype that differs, fails the
``ema`` check in one line - a resume or an evaluation of those weights would fail on it.
LeRobot's ``ema_state.pt`` has no names: its tensors (the policy's parameters, in order) must
each match a live tensor of the same shape and dtype, no more tensors than the model has.
Headers only, like the rest of ``inspect``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_tools.check import Check
from ckpt_tools.dcp import validate
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.errors import CkptError
from ckpt_tools.facts.ema_state import read_ema_state
from ckpt_tools.format import layout as L
from ckpt_tools.format.record import TrainingStep
from ckpt_tools.st import dtypes
from ckpt_tools.st.header import read_header
from ckpt_tools.st.index import read_index

Table = dict[str, tuple[str, tuple[int, ...]]]  # tensor name -> (torch dtype name, shape)
DCP_PREFIX = f"{L.MODEL_DCP_KEY}."
# How an EMA container's tensors are matched with the live ones:
WHOLE = "whole"  # by name, every live tensor (a saved policy: pretrained_model_ema/)
PARAMETERS = "parameters"  # by name, a subset (ckpt-train's ema_state.pt: the parameters)
UNNAMED = "unnamed"  # by shape and dtype (LeRobot's ema_state.pt: a list in parameters() order)


@dataclass(frozen=True)
class EmaForm:
    """One container of the EMA weights: ``form`` is ``safetensors``, ``dcp`` or ``ema_state.pt``."""

    form: str
    path: str  # relative to the step dir
    tensors: int
    bytes: int


def has_ema(paths: L.StepPaths) -> bool:
    """Whether the step holds any EMA weights (the ``pretrained_model_ema/`` folder or ``ema_state.pt``)."""
    return paths.pretrained_model_ema.is_dir() or paths.ema_state.exists()


def inspect_ema(paths: L.StepPaths, record: TrainingStep | None) -> tuple[dict[str, Any], Check]:
    """The ``ema`` section of the report and its check (call only when :func:`has_ema`)."""
    forms: list[EmaForm] = []
    problems: list[str] = []
    try:
        live = _live_table(paths)
    except CkptError as e:
        live, problems = None, [f"the live weights: {e}"]
    updates = record.ema_steps if record is not None else None
    for form, rel, read in _forms(paths):
        try:
            table, nbytes, match, steps = read()
        except CkptError as e:
            problems.append(str(e))
            continue
        forms.append(EmaForm(form, rel, len(table), nbytes))
        updates = steps if updates is None else updates
        if live is not None:
            problem = (
                _unnamed_mismatch(list(table.values()), live) if match == UNNAMED else _mismatch(table, live, match)
            )
            if problem is not None:
                problems.append(f"{rel}: {problem}")
    section = {"present": True, "forms": [vars(f) for f in forms], "updates": updates, "consistent": not problems}
    if not forms and not problems:
        problems.append(f"{L.PRETRAINED_MODEL_EMA_DIR}/ holds no EMA weights (no model.safetensors, no DCP shards)")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return section, Check.fail("ema", problems[0] + more)
    shown = ", ".join(f"{f.form} ({f.tensors} tensors, {f.bytes} bytes)" for f in forms)
    after = f" after {updates} updates" if updates is not None else ""
    return section, Check.ok("ema", f"EMA weights{after} in {shown}: the live model's names, shapes and dtypes")


def _forms(paths: L.StepPaths) -> list[tuple[str, str, Any]]:
    """The EMA containers present, each with its reader: (table, bytes, how it matches, update count or None)."""
    out: list[tuple[str, str, Any]] = []
    ema_dir = paths.pretrained_model_ema
    if paths.ema_model_weights.exists() or (ema_dir / L.MODEL_WEIGHTS_INDEX).exists():
        out.append(("safetensors", _rel(paths, ema_dir), lambda: (*_safetensors_table(ema_dir), WHOLE, None)))
    if paths.ema_model_dcp.is_dir():
        out.append(("dcp", _rel(paths, paths.ema_model_dcp), lambda: (*_dcp_table(paths.ema_model_dcp), WHOLE, None)))
    if paths.ema_state.exists():
        out.append(("ema_state.pt", _rel(paths, paths.ema_state), lambda: _ema_state_table(paths.ema_state)))
    return out


def _live_table(paths: L.StepPaths) -> Table:
    """The live weights' names, dtypes and shapes: the gathered file if any, else the DCP shards."""
    pm = paths.pretrained_model
    if paths.model_weights.exists() or (pm / L.MODEL_WEIGHTS_INDEX).exists():
        return _safetensors_table(pm)[0]
    if paths.model_dcp.is_dir():
        return _dcp_table(paths.model_dcp)[0]
    raise CkptError(f"{L.PRETRAINED_MODEL_DIR}/ holds no weights to compare the EMA weights with")


def _safetensors_table(folder: Path) -> tuple[Table, int]:
    index = folder / L.MODEL_WEIGHTS_INDEX
    files = (
        [folder / L.MODEL_WEIGHTS]
        if (folder / L.MODEL_WEIGHTS).exists()
        else [folder / f for f in sorted(set(read_index(index).values()))]
    )
    table: Table = {}
    nbytes = 0
    for f in files:
        header = read_header(f)
        if header.problems:
            raise CkptError(f"{f}: {header.problems[0]}")
        for e in header.entries.values():
            known = dtypes.BY_SAFETENSORS.get(e.dtype)
            table[e.name] = (known.name if known else e.dtype, tuple(e.shape))
            nbytes += e.nbytes
    return table, nbytes


def _dcp_table(directory: Path) -> tuple[Table, int]:
    """The model's tensors of a DCP dir, named as in the model (the ``model.`` key stripped)."""
    index = ChunkIndex.load(directory)
    problems = validate.structure_problems(index)
    if problems:
        raise CkptError(f"{directory}: {validate.summary(problems)}")
    table: Table = {}
    nbytes = 0
    for e in index.tensors.values():
        name = e.fqn.removeprefix(DCP_PREFIX)
        table[name] = (e.dtype, tuple(e.shape))
        nbytes += e.nbytes or 0
    return table, nbytes


def _ema_state_table(path: Path) -> tuple[Table, int, str, int]:
    saved = read_ema_state(path)
    names = saved.names or tuple(f"shadow_params[{i}]" for i in range(len(saved.tensors)))
    table = {n: (t.dtype.name, tuple(t.size)) for n, t in zip(names, saved.tensors, strict=True)}
    return table, saved.nbytes, PARAMETERS if saved.names is not None else UNNAMED, saved.optimization_step


def _mismatch(ema: Table, live: Table, match: str) -> str | None:
    """The first difference of names, shapes or dtypes between the EMA weights and the live ones, or None.

    Every EMA tensor must be a live one; the gathered and DCP forms hold the whole model
    (buffers too, :data:`WHOLE`), so there every live tensor must also be in the EMA weights;
    ckpt-train's ``ema_state.pt`` holds the parameters only (:data:`PARAMETERS`).
    """
    missing = sorted(set(live) - set(ema)) if match == WHOLE else []
    if missing:
        return f"no EMA tensor for {len(missing)} live tensor(s), first {missing[0]}"
    extra = sorted(set(ema) - set(live))
    if extra:
        return f"{len(extra)} tensor(s) the live model does not have, first {extra[0]}"
    for name, (dtype, shape) in ema.items():
        if live[name][1] != shape:
            return f"{name} is {list(shape)}, the live model's {list(live[name][1])}"
        if live[name][0] != dtype:
            return f"{name} is {dtype}, the live model's {live[name][0]}"
    return None


def _unnamed_mismatch(ema: list[tuple[str, tuple[int, ...]]], live: Table) -> str | None:
    """LeRobot's nameless shadow: each tensor a live tensor's shape and dtype, never more than the model has."""
    unmatched = Counter(ema) - Counter(live.values())
    if len(ema) > len(live):
        return f"{len(ema)} shadow tensors, the live model has {len(live)}"
    if unmatched:
        dtype, shape = next(iter(unmatched))
        return f"a {list(shape)} {dtype} shadow tensor matches no live tensor"
    return None


def _rel(paths: L.StepPaths, path: Path) -> str:
    return path.relative_to(paths.root).as_posix()
