"""The names and shapes of the weights a resume reads, for :mod:`ckpt_tools.format.rules.load_plan`.

From the safetensors header or the DCP metadata of the container the loader chooses, never
from the tensor data.
"""

from __future__ import annotations

from collections.abc import Mapping

from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.errors import CkptError
from ckpt_tools.format import layout as L
from ckpt_tools.format import manifest
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.rules.load_plan import Shape, problems
from ckpt_tools.st.header import read_header


def saved_shapes(paths: StepPaths) -> dict[str, Shape] | None:
    """Name -> shape of the whole-model weights the resume reads (None: none readable here, another check says why)."""
    chosen = manifest.choose(manifest.weights_inputs(False), paths)
    if chosen is None:
        return None
    try:
        if chosen is manifest.MODEL_DCP:
            index = ChunkIndex.load(paths.root / chosen.path)
            return {
                ".".join(str(p) for p in entry.path[1:]): tuple(entry.shape)
                for entry in index.tensors.values()
                if entry.path and entry.path[0] == L.MODEL_DCP_KEY
            }
        header = read_header(paths.root / chosen.path)
        if header.problems:
            return None
        return {name: tuple(entry.shape) for name, entry in header.entries.items()}
    except (CkptError, OSError, ValueError):
        return None


def mismatch(paths: StepPaths, expected: Mapping[str, Shape]) -> str | None:
    """One line: why the weights of ``paths`` do not load into a model of ``expected`` shapes (None: they do)."""
    saved = saved_shapes(paths)
    if saved is None:
        return None
    strict = manifest.choose(manifest.weights_inputs(False), paths) is not manifest.MODEL_DCP
    found = problems(expected, saved, strict=strict)
    if not found:
        return None
    return f"{paths.root}: its weights do not fit the model: {'; '.join(found)}"
