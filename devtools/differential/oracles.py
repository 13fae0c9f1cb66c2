"""Ground truth: what the reference readers load, and whether a resume ended where it should.

The tools claim a checkpoint is healthy (``inspect``) or resumable (``verify-resume``). The
truth for the first is whether the libraries that own the formats load the data - the
safetensors library on every ``.safetensors``, torch's DCP reader (``FileSystemReader``
metadata, then a real single-process load of every item into tensors of the metadata's
shapes), ``torch.load(weights_only=True)`` on ``.pt`` / ``.pth`` / ``.bin`` - run in a forked
child with a memory cap and a deadline (:func:`devtools.reliability.fuzz_runner.fenced`), since
a damaged file may make them hang or crash. The truth for the second is the real resume,
compared with the unmutated resume from the same step: the final step's weights, optimizer
state, scheduler and per-rank generators (:func:`devtools.training.state_differences`) and the
losses it logged.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from devtools.reliability.fuzz_runner import fenced
from devtools.training import losses, state_differences

READER_TIMEOUT = 60.0
TORCH_FILES = (".pt", ".pth", ".bin")
SCHEDULER = "training_state/scheduler_state.json"


def data_objects(step: Path) -> list[str]:
    """What the reference readers judge, relative to the step: safetensors and torch files, DCP dirs, index JSON."""
    out = []
    for dirpath, dirnames, filenames in os.walk(step):
        here = Path(dirpath)
        if ".metadata" in filenames:
            out.append(str(here.relative_to(step)))
        for name in filenames:
            if name.endswith((".safetensors", *TORCH_FILES, ".safetensors.index.json")):
                out.append(str((here / name).relative_to(step)))
        dirnames.sort()
    return sorted(out)


def _load_one(step: Path, rel: str) -> str:
    """'ok' when the owning library loads every tensor of ``rel``; else 'error: <type>: <message>'."""
    path = step / rel
    try:
        if rel.endswith(".safetensors.index.json"):
            from safetensors import safe_open

            weight_map = json.loads(path.read_text())["weight_map"]
            for name, file in weight_map.items():
                with safe_open(str(path.parent / file), "pt") as f:
                    f.get_tensor(name)
        elif rel.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(str(path), "pt") as f:
                f.metadata()
                for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    f.get_tensor(key)
        elif rel.endswith(TORCH_FILES):
            import torch

            torch.load(path, weights_only=True, map_location="cpu")
        else:
            import warnings

            from torch.distributed.checkpoint import FileSystemReader
            from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

            FileSystemReader(str(path)).read_metadata()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "torch.distributed is unavailable ... single process"
                _load_state_dict_from_keys(storage_reader=FileSystemReader(str(path)))
    except BaseException as e:  # any failure of the reference is its verdict
        return f"error: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return "ok"


def reference_verdicts(step: Path) -> dict[str, str]:
    """Each data object's verdict from the reference readers (a hang or a crash is a failure too)."""
    import safetensors  # noqa: F401  (imported once here: each forked reader inherits them)
    import torch.distributed.checkpoint  # noqa: F401

    out = {}
    for rel in data_objects(step):
        result = fenced(lambda rel=rel: _load_one(step, rel), READER_TIMEOUT)
        out[rel] = result["value"] if result.get("status") == "done" else f"error: reader {result.get('status')}"
    return out


def final_state_differences(final: Path, reference_final: Path) -> list[str]:
    """Where a resumed run's last checkpoint differs from the reference resume's (empty: the same)."""
    if not final.is_dir():
        return [f"no checkpoint {final.name} after the resume"]
    with tempfile.TemporaryDirectory(prefix="differential-") as tmp:
        try:
            found = state_differences(final, reference_final, Path(tmp))
            # The scheduler file carries its save's id: compare the state, not the id.
            found = [d for d in found if d != f"{SCHEDULER} differs"]
            if _scheduler_state(final) != _scheduler_state(reference_final):
                found.append(f"{SCHEDULER} differs (save_id aside)")
            return found
        except Exception as e:  # a state the comparison cannot even read differs
            return [f"unreadable: {type(e).__name__}: {' '.join(str(e).split())[:200]}"]


def _scheduler_state(step: Path) -> Any:
    doc = json.loads((step / SCHEDULER).read_text())
    if isinstance(doc, dict):
        doc.pop("save_id", None)
    return doc


def logged_losses(run: Path) -> list[float] | None:
    """The losses a resume logged (None when it logged nothing)."""
    try:
        return losses(run)
    except (OSError, ValueError, KeyError):
        return None


def same_losses(a: list[float] | None, b: list[float] | None) -> bool:
    """Bit-for-bit equal losses; NaN equals NaN (the same divergence)."""
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b, strict=True))


def describe(value: Any) -> str:
    return " ".join(str(value).split())[:300]
