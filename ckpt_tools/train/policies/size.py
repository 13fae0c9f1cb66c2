"""How much memory a policy will take, from its config alone - refused before anything is allocated.

A policy config is a few numbers (``--policy.dim_model``, layer counts, ...) and a 2 KB
``config.json`` can ask for tens of GB: building it would then die in the allocator (a
traceback, or the kernel's OOM killer taking the whole job) minutes into start-up. So start-up
counts the parameters from the config (each policy's
:meth:`~ckpt_tools.train.policies.base.PreTrainedPolicy.parameter_count`), estimates what this
machine will hold, and refuses with one line naming the estimate and the memory available.

The estimate, per process on this host (fp32 throughout: the training core keeps fp32 master
weights whatever the mixed precision):

- the policy is built whole, on the CPU, by every process (4 bytes per parameter);
- on a CPU run, the gradients and AdamW's two moments of the trainable parameters (12 bytes
  each), split over the ``dp_shard`` ranks that shard them (FSDP2); on an accelerator they
  live in device memory, and only the build counts against the host. A PEFT run trains an
  adapter only: its frozen base needs no gradients or optimizer state.

- on a CPU run, a lower bound of the activations one step keeps for its backward (each policy's
  :meth:`~ckpt_tools.train.policies.base.PreTrainedPolicy.activation_bytes`: attention scores
  grow with the square of ``--policy.chunk_size``, everything with ``--batch_size``);

times the processes launched on this host. Batches and the DCP staging copies come on top, so
passing the check does not promise the run fits; failing it means it cannot.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_tools.errors import ConfigError
from ckpt_tools.train.policies.configs import PolicyConfig
from ckpt_tools.units import human_bytes, human_count

FP32_BYTES = 4
ADAMW_MOMENTS = 2
POSITIVE_FIELDS = (
    "chunk_size",
    "state_dim",
    "action_dim",
    "dim_model",
    "n_heads",
    "dim_feedforward",
    "n_obs_tokens",
    "hidden_dim",
)
FILLED_FROM_DATASET = ("state_dim", "action_dim")  # None until the dataset says (a null elsewhere cannot build)
COUNT_FIELDS = ("n_encoder_layers", "n_decoder_layers", "n_layers")  # zero layers builds (a degenerate policy)


@dataclass(frozen=True)
class MemoryEstimate:
    parameters: int
    bytes_per_process: int
    processes: int
    activations: int = 0  # of bytes_per_process: what one step's forward keeps for the backward

    @property
    def total(self) -> int:
        return self.bytes_per_process * self.processes

    def describe(self) -> str:
        each = f" ({self.processes} processes × {human_bytes(self.bytes_per_process)})" if self.processes > 1 else ""
        return f"{human_count(self.parameters)} parameters need about {human_bytes(self.total)}{each}"


def check_sizes(config: PolicyConfig) -> None:
    """Sizes a policy can be built with: positive dimensions, layer counts ≥ 0, heads dividing the width."""
    for name in POSITIVE_FIELDS + COUNT_FIELDS:
        if not hasattr(config, name):
            continue
        value = getattr(config, name)
        low = 1 if name in POSITIVE_FIELDS else 0
        if value is None and name in FILLED_FROM_DATASET:
            continue
        if value is None or isinstance(value, bool) or not isinstance(value, int) or value < low:
            kind = "a positive integer" if low else "an integer ≥ 0"
            raise ConfigError(f"--policy.{name}={value}: must be {kind}")
    heads, width = getattr(config, "n_heads", None), getattr(config, "dim_model", None)
    if heads is not None and width is not None and width % heads:
        raise ConfigError(f"--policy.n_heads={heads} does not divide --policy.dim_model={width}")


def estimate(
    config: PolicyConfig,
    *,
    processes: int = 1,
    shards: int = 1,
    peft: bool = False,
    on_host: bool = True,
    batch_size: int | None = None,
) -> MemoryEstimate | None:
    """What ``config`` (state and action sizes filled in) will take on this host (None: the policy cannot say).

    ``batch_size``: per process; with it (on a CPU run) the activations of one step count too.
    """
    from ckpt_tools.train.policies.registry import POLICY_CLASSES

    check_sizes(config)
    policy = POLICY_CLASSES[type(config)]
    parameters = policy.parameter_count(config)
    if parameters is None:
        return None
    per_process = parameters * FP32_BYTES
    if on_host and not peft:
        per_process += -(-parameters * FP32_BYTES * (1 + ADAMW_MOMENTS) // max(1, shards))
    activations = (policy.activation_bytes(config, batch_size) or 0) if on_host and batch_size else 0
    return MemoryEstimate(parameters, per_process + activations, max(1, processes), activations)


def available_memory() -> int | None:
    """Bytes this host can still give (``MemAvailable``), from psutil or ``/proc/meminfo`` (None: unknown)."""
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def require_fits(
    config: PolicyConfig,
    *,
    processes: int = 1,
    shards: int = 1,
    peft: bool = False,
    on_host: bool = True,
    available: int | None = None,
    batch_size: int | None = None,
) -> MemoryEstimate | None:
    """Refuse, in one line, a policy whose weights, training state and activations cannot fit in this host's memory.

    ``available`` defaults to :func:`available_memory`; with neither known the check is skipped.
    """
    found = estimate(config, processes=processes, shards=shards, peft=peft, on_host=on_host, batch_size=batch_size)
    free = available if available is not None else available_memory()
    if found is not None and free is not None and found.total > free:
        fix = "choose smaller --policy sizes, or shard it (--parallelism.dp_shard) over more machines"
        if found.activations * 2 > found.bytes_per_process:
            fix = "choose a smaller --batch_size or --policy.chunk_size (the activations dominate)"
        acts = f", and {human_bytes(found.activations)} of activations in one step" if found.activations else ""
        raise ConfigError(
            f"--policy.type={config.type}: {found.describe()} (fp32 weights"
            f"{', gradients and AdamW state' if on_host and not peft else ''}{acts}), but this machine has"
            f" {human_bytes(free)} available; {fix}"
        )
    return found
