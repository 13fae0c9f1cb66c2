"""Per-rank random number generator state, gathered into one ``rng_state.safetensors``.

Every rank draws its own dropout masks, so every rank's generator state is saved (keys
``rank{r}.torch`` and ``rank{r}.cuda``). A resume on the same world size restores each
rank's own state (bit-exact continuation); on another world size there is no meaningful
mapping, so ranks reseed from (seed, step, rank) and the resume says it is not exact.

The same file also holds the main rank's generators under LeRobot's names and dtypes
(``utils/random_utils.py`` ``serialize_rng_state``: ``py_rng_*``, ``np_rng_*``,
``torch_rng_state``, ``torch_cuda_rng_state`` on CUDA), so LeRobot's ``load_rng_state`` reads it:
it picks its keys by the prefixes ``py``/``np``/``torch``, which ``rank{r}.*`` never starts with.
ckpt-train draws from neither Python's ``random`` nor NumPy's global generator, so it writes
them for LeRobot and does not read them back.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from ckpt_tools.errors import CheckpointError
from ckpt_tools.train.parallel.distributed import DistEnv
from ckpt_tools.train.safetensors_io import save_state_dict


def local_rng_state() -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def lerobot_rng_state() -> dict[str, torch.Tensor]:
    """This process's generators as LeRobot's ``serialize_rng_state`` writes them (names, dtypes, shapes)."""
    py_version, py_state, _ = random.getstate()
    kind, values, index, has_gauss, cached = np.random.get_state()
    assert kind == "MT19937"
    out = {
        "py_rng_version": torch.tensor([py_version], dtype=torch.int64),
        "py_rng_state": torch.tensor(py_state, dtype=torch.int64),
        "np_rng_state_values": torch.tensor(values, dtype=torch.int64),
        "np_rng_state_index": torch.tensor([index], dtype=torch.int64),
        "np_rng_has_gauss": torch.tensor([has_gauss], dtype=torch.int64),
        "np_rng_cached_gaussian": torch.tensor([cached], dtype=torch.float32),
        "torch_rng_state": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        out["torch_cuda_rng_state"] = torch.cuda.get_rng_state()
    return out


def gather_rng_states(env: DistEnv) -> dict[str, torch.Tensor] | None:
    """Collective: every rank's generator state, on the main rank (None elsewhere), and the main rank's in LeRobot's form."""
    lerobot = lerobot_rng_state() if env.is_main else {}
    mine = local_rng_state()
    if not env.distributed:
        return {**lerobot, **{f"rank0.{k}": v for k, v in mine.items()}}
    gathered: list[dict[str, torch.Tensor] | None] = [None] * env.world_size
    dist.all_gather_object(gathered, mine)  # our own ranks' tensors, never data read from disk
    if not env.is_main:
        return None
    out = dict(lerobot)
    for rank, states in enumerate(gathered):
        assert states is not None
        out.update({f"rank{rank}.{k}": v for k, v in states.items()})
    return out


def save_rng_states(
    states: dict[str, torch.Tensor], path: Path, world_size: int, stamp: dict[str, str] | None = None
) -> None:
    save_state_dict(states, path, metadata={"world_size": str(world_size), **(stamp or {})})


def load_rng_states(path: Path, env: DistEnv) -> None:
    """Restore this rank's generator from the states saved on the same world size."""
    try:
        states = load_file(str(path))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise CheckpointError(f"{path}: unreadable ({e})") from None
    key = f"rank{env.rank}.torch"
    if key not in states:
        raise CheckpointError(f"{path}: no generator state for rank {env.rank}")
    torch.set_rng_state(states[key])
    cuda_key = f"rank{env.rank}.cuda"
    if torch.cuda.is_available() and cuda_key in states:
        torch.cuda.set_rng_state(states[cuda_key])


def reseed(env: DistEnv, seed: int, step: int) -> None:
    """A resume onto another world size: no saved state maps onto this rank, so derive one."""
    torch.manual_seed(seed + 7919 * step + env.rank)
