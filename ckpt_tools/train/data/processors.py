"""Normalization pre/post processors, saved beside the weights.

The preprocessor maps raw observations and actions to zero mean / unit variance with the
dataset statistics; the postprocessor maps predicted actions back. Each is saved as
``policy_{pre,post}processor.json`` (its steps) plus one
``policy_{...}_step_{i}_{name}.safetensors`` per stateful step, so a policy loads with
its own statistics and not the dataset's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from ckpt_tools.errors import CheckpointError
from ckpt_tools.format import layout
from ckpt_tools.io.fsutil import write_json_atomic
from ckpt_tools.io.safe_read import read_json
from ckpt_tools.train.safetensors_io import save_state_dict

EPS = 1e-8


@dataclass
class Normalizer:
    """Mean/std normalization of some batch keys (``inverse`` undoes it)."""

    keys: tuple[str, ...]
    mean: dict[str, torch.Tensor]
    std: dict[str, torch.Tensor]
    inverse: bool = False
    name: str = "normalizer_processor"

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(batch)
        for key in self.keys:
            if key not in out:
                continue
            mean, std = self.mean[key].to(out[key].device), self.std[key].to(out[key].device)
            out[key] = out[key] * (std + EPS) + mean if self.inverse else (out[key] - mean) / (std + EPS)
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = {}
        for key in self.keys:
            state[f"{key}.mean"] = self.mean[key]
            state[f"{key}.std"] = self.std[key]
        return state


@dataclass
class Pipeline:
    """An ordered list of processor steps, persisted under one file prefix."""

    prefix: str  # layout.PREPROCESSOR or layout.POSTPROCESSOR
    steps: list[Normalizer]

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for step in self.steps:
            batch = step(batch)
        return batch

    def save(self, directory: Path) -> None:
        entries = []
        for i, step in enumerate(self.steps):
            state_file = f"{self.prefix}_step_{i}_{step.name}.safetensors"
            save_state_dict(step.state_dict(), directory / state_file)
            entries.append(
                {
                    "registry_name": step.name,
                    "config": {"keys": list(step.keys), "inverse": step.inverse},
                    "state_file": state_file,
                }
            )
        write_json_atomic(directory / f"{self.prefix}.json", {"name": self.prefix, "steps": entries})

    @classmethod
    def load(cls, directory: Path, prefix: str) -> Pipeline:
        path = directory / f"{prefix}.json"
        try:
            spec = read_json(path)
            steps = []
            for entry in spec["steps"]:
                keys = tuple(entry["config"]["keys"])
                state = load_file(str(directory / Path(entry["state_file"]).name))
                steps.append(
                    Normalizer(
                        keys=keys,
                        mean={k: state[f"{k}.mean"] for k in keys},
                        std={k: state[f"{k}.std"] for k in keys},
                        inverse=bool(entry["config"]["inverse"]),
                        name=str(entry["registry_name"]),
                    )
                )
        except (OSError, KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: unreadable processor ({type(e).__name__}: {e})") from None
        return cls(prefix, steps)


def make_processors(stats: dict[str, dict[str, list[float]]]) -> tuple[Pipeline, Pipeline]:
    """Pre (normalize state and action targets) and post (unnormalize actions) pipelines."""
    keys = ("observation.state", "action")
    mean = {k: torch.tensor(stats[k]["mean"], dtype=torch.float32) for k in keys}
    std = {k: torch.tensor(stats[k]["std"], dtype=torch.float32) for k in keys}
    pre = Pipeline(layout.PREPROCESSOR, [Normalizer(keys, mean, std)])
    post = Pipeline(
        layout.POSTPROCESSOR, [Normalizer(("action",), {"action": mean["action"]}, {"action": std["action"]}, True)]
    )
    return pre, post
