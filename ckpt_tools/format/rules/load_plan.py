"""Whether a checkpoint's weights fit the model the resume builds: every name there, every shape equal.

The resume rebuilds the policy from ``train_config.json`` and the dataset (whose features set
its input and output sizes), then loads the weights into it: torch's loads stop on a missing
tensor or a shape that differs, and the strict load of the gathered file also on a tensor the
model does not have (a DCP load reads only what the model asks for). Before this rule the tools
could not know the model, and called such a checkpoint resumable; now the trainer's pre-flight
(:mod:`ckpt_tools.train.preflight`, run by ``ckpt-train --dry_run=true`` and by
``verify-resume`` where torch is installed) and the load itself compare the same two tables with
this one function, torch-free: names and shapes of the saved weights come from the safetensors
header or the DCP metadata, never from the tensor data (read by :mod:`ckpt_tools.facts.load_plan`).
"""

from __future__ import annotations

from collections.abc import Mapping

Shape = tuple[int, ...]
LISTED = 3  # names a line gives; the rest are counted


def problems(expected: Mapping[str, Shape], saved: Mapping[str, Shape], *, strict: bool) -> list[str]:
    """What the load would stop on: missing names, other shapes, and (``strict``) names the model lacks."""
    out = []
    missing = [name for name in expected if name not in saved]
    if missing:
        out.append(f"the model the config builds has {_names(missing)} that the checkpoint does not hold")
    other = [(name, saved[name], shape) for name, shape in expected.items() if name in saved and saved[name] != shape]
    if other:
        name, have, want = other[0]
        more = f" (and {len(other) - 1} more)" if len(other) > 1 else ""
        out.append(
            f"{name} is {list(have)} in the checkpoint, {list(want)} in the model the config and dataset build{more}"
        )
    extra = [name for name in saved if name not in expected] if strict else []
    if extra:
        out.append(f"the checkpoint holds {_names(extra)} that the model the config builds does not have")
    return out


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED])
    more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
    return f"{len(names)} tensor{'s' if len(names) != 1 else ''} ({shown}{more})"
