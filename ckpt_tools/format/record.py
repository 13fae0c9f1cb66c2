"""The topology record ``training_step.json`` and the batch arithmetic built on it.

The record says where a run was (step, samples seen, sampler position) and on what it ran
(world size, ``dp_replicate × dp_shard``, precision, checkpoint format), so that a resume -
or a tool deciding whether a resume can work - never has to guess. It carries a schema
version; older or foreign records (the 0.6.x ``num_processes`` key, missing fields) still
parse, and :attr:`TrainingStep.unknown` lists what they could not tell.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ckpt_tools.errors import CheckpointError
from ckpt_tools.io.safe_read import read_json_file

SCHEMA_VERSION = 1


class Layout(str, enum.Enum):
    """How the model is laid out across data-parallel workers."""

    SINGLE = "single"  # one process, no wrapper
    DDP = "ddp"  # full replica per process
    FSDP = "fsdp"  # sharded over every process
    HSDP = "hsdp"  # sharded inside groups of dp_shard, replicated across dp_replicate groups

    @property
    def sharded(self) -> bool:
        return self in (Layout.FSDP, Layout.HSDP)


def layout_for(world_size: int, dp_replicate: int, dp_shard: int) -> Layout:
    """The layout a (world size, R, S) triple describes; R×S must equal the world size."""
    if dp_replicate * dp_shard != world_size:
        raise ValueError(f"dp_replicate × dp_shard = {dp_replicate}×{dp_shard} ≠ world size {world_size}")
    if dp_shard > 1:
        return Layout.HSDP if dp_replicate > 1 else Layout.FSDP
    return Layout.DDP if world_size > 1 else Layout.SINGLE


@dataclass(frozen=True)
class Topology:
    world_size: int
    dp_replicate: int
    dp_shard: int
    nnodes: int | None = None

    @property
    def layout(self) -> Layout:
        return layout_for(self.world_size, self.dp_replicate, self.dp_shard)

    @property
    def dp_world_size(self) -> int:
        # Every process is a data-parallel worker: sharding splits the model, not the data.
        return self.dp_replicate * self.dp_shard

    def describe(self) -> str:
        layout = self.layout
        if layout is Layout.HSDP:
            mesh = f"{self.dp_replicate}×{self.dp_shard} (dp_replicate×dp_shard)"
        elif layout is Layout.FSDP:
            mesh = f"{self.dp_shard} shards"
        else:
            mesh = f"{self.world_size} process{'es' if self.world_size != 1 else ''}"
        nodes = f", {self.nnodes} node{'s' if self.nnodes != 1 else ''}" if self.nnodes else ""
        return f"{layout.value.upper()} over {mesh}{nodes}"


@dataclass(frozen=True)
class BatchFactorization:
    """``effective = batch_size × dp_world_size × grad_accum`` and what one step consumes."""

    batch_size: int
    dp_world_size: int
    grad_accum_steps: int

    @property
    def samples_per_step(self) -> int:
        return self.batch_size * self.dp_world_size

    @property
    def effective_batch_size(self) -> int:
        return self.samples_per_step * self.grad_accum_steps

    def describe(self) -> str:
        return (
            f"effective batch {self.effective_batch_size} = batch_size {self.batch_size}"
            f" × dp_world_size {self.dp_world_size} × grad_accum {self.grad_accum_steps}"
        )


@dataclass(frozen=True)
class SamplerPosition:
    """Where the global sample stream stands: ``samples_seen = epoch × dataset_size + offset``."""

    epoch: int
    offset: int
    seed: int
    dataset_size: int | None = None


@dataclass(frozen=True)
class MixedPrecisionPolicyRecord:
    """The FSDP2 mixed-precision policy as resolved at start-up (dtype names, or None)."""

    param_dtype: str | None = None
    reduce_dtype: str | None = None
    output_dtype: str | None = None
    cast_forward_inputs: bool = True


@dataclass(frozen=True)
class TrainingStep:
    """One ``training_step.json``. Fields a record did not carry are None and named in ``unknown``."""

    step: int
    samples_seen: int | None = None
    optimizer_steps: int | None = None  # optimizer updates the loop ran (fp16 counts the ones the scaler skipped)
    adam_step: int | None = None  # the step count the saved optimizer state holds (its largest ``step``)
    dp_world_size: int | None = None
    batch_size: int | None = None
    grad_accum_steps: int | None = None
    mixed_precision: str | None = None
    mixed_precision_policy: MixedPrecisionPolicyRecord | None = None
    checkpoint_format: str | None = None
    topology: Topology | None = None
    sampler: SamplerPosition | None = None
    sharded: bool | None = None
    peft: bool | None = None
    versions: dict[str, str] = field(default_factory=dict)
    schema_version: int | None = SCHEMA_VERSION
    # Filled by from_dict: what the record did not say, and keys it had that we do not know.
    unknown: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    legacy_num_processes: int | None = None

    @property
    def is_legacy(self) -> bool:
        """The 0.6.x-era record: ``num_processes`` and no topology."""
        return self.topology is None and self.legacy_num_processes is not None

    @property
    def batch(self) -> BatchFactorization | None:
        if None in (self.batch_size, self.dp_world_size, self.grad_accum_steps):
            return None
        assert self.batch_size is not None and self.dp_world_size is not None
        assert self.grad_accum_steps is not None
        return BatchFactorization(self.batch_size, self.dp_world_size, self.grad_accum_steps)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        for f in fields(self):
            if f.name in ("unknown", "extra", "legacy_num_processes", "schema_version"):
                continue
            value = getattr(self, f.name)
            out[f.name] = asdict(value) if hasattr(value, "__dataclass_fields__") else value
        if self.topology is not None:
            out["topology"]["layout"] = self.topology.layout.value
        if self.batch is not None:
            out["effective_batch_size"] = self.batch.effective_batch_size
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingStep:
        """Parse any record we may meet: current, older schema, or 0.6.x (``num_processes``)."""
        if not isinstance(data, dict):
            raise CheckpointError("training_step.json: expected a JSON object")
        if "step" not in data:
            raise CheckpointError("training_step.json: no 'step' field")
        step = _int(data, "step")
        if step is None:
            raise CheckpointError("training_step.json: 'step' is null")
        known = {f.name for f in fields(cls)} | {"effective_batch_size"}
        legacy = _int(data, "num_processes") if "num_processes" in data else None
        topology = _topology(data.get("topology"))
        dp_world_size = _int(data, "dp_world_size")
        if dp_world_size is None and topology is not None:
            dp_world_size = topology.dp_world_size
        record = cls(
            step=step,
            samples_seen=_int(data, "samples_seen"),
            optimizer_steps=_int(data, "optimizer_steps"),
            adam_step=_int(data, "adam_step"),
            dp_world_size=dp_world_size,
            batch_size=_int(data, "batch_size"),
            grad_accum_steps=_int(data, "grad_accum_steps"),
            mixed_precision=_str(data, "mixed_precision"),
            mixed_precision_policy=_policy(data.get("mixed_precision_policy")),
            checkpoint_format=_str(data, "checkpoint_format"),
            topology=topology,
            sampler=_sampler(data.get("sampler")),
            sharded=_bool(data, "sharded"),
            peft=_bool(data, "peft"),
            versions={str(k): str(v) for k, v in (data.get("versions") or {}).items()}
            if isinstance(data.get("versions"), dict)
            else {},
            schema_version=_int(data, "schema_version"),
            extra={k: v for k, v in data.items() if k not in known and k != "num_processes"},
            legacy_num_processes=legacy,
        )
        missing = tuple(
            name
            for name in (
                "samples_seen",
                "dp_world_size",
                "batch_size",
                "grad_accum_steps",
                "mixed_precision",
                "checkpoint_format",
                "topology",
                "sampler",
                "sharded",
                "peft",
            )
            if getattr(record, name) is None
        )
        return replace(record, unknown=missing)

    def unknown_summary(self) -> str | None:
        """One line saying what this record could not tell, or None if it is complete."""
        if not self.unknown:
            return None
        origin = "0.6.x-era record (num_processes)" if self.is_legacy else "record"
        return f"{origin} does not say: {', '.join(self.unknown)}"


def read_training_step(path: str | os.PathLike[str]) -> TrainingStep:
    p = Path(path)
    data = read_json_file(p, missing="missing (every checkpoint's training_state/ has one)")
    try:
        return TrainingStep.from_dict(data)
    except CheckpointError as e:
        raise CheckpointError(f"{p}: {str(e).removeprefix('training_step.json: ')}") from None


def training_step_json(record: TrainingStep) -> str:
    return json.dumps(record.to_dict(), indent=2, sort_keys=False) + "\n"


# --- field coercion: a foreign record gets one clear line, never a traceback -----------------


def _show(value: Any) -> str:
    """A value for a one-line message: a hostile record may hold megabytes in one field."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(f"training_step.json: '{key}' must be a non-negative integer, got {_show(value)}")
    return value


def _str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise CheckpointError(f"training_step.json: '{key}' must be a string, got {_show(value)}")
    return value


def _bool(data: dict[str, Any], key: str) -> bool | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise CheckpointError(f"training_step.json: '{key}' must be true or false, got {_show(value)}")
    return value


def _object(value: Any, key: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CheckpointError(f"training_step.json: '{key}' must be an object, got {_show(value)}")
    return value


def _topology(value: Any) -> Topology | None:
    data = _object(value, "topology")
    if data is None:
        return None
    world, r, s = _int(data, "world_size"), _int(data, "dp_replicate"), _int(data, "dp_shard")
    if world is None or r is None or s is None or world == 0 or r == 0 or s == 0:
        raise CheckpointError("training_step.json: 'topology' needs positive world_size, dp_replicate and dp_shard")
    if r * s != world:
        raise CheckpointError(f"training_step.json: topology dp_replicate×dp_shard = {r}×{s} ≠ world_size {world}")
    return Topology(world_size=world, dp_replicate=r, dp_shard=s, nnodes=_int(data, "nnodes"))


def _sampler(value: Any) -> SamplerPosition | None:
    data = _object(value, "sampler")
    if data is None:
        return None
    epoch, offset, seed = _int(data, "epoch"), _int(data, "offset"), data.get("seed")
    if epoch is None or offset is None or not isinstance(seed, int) or isinstance(seed, bool):
        raise CheckpointError("training_step.json: 'sampler' needs integer epoch, offset and seed")
    return SamplerPosition(epoch=epoch, offset=offset, seed=seed, dataset_size=_int(data, "dataset_size"))


def _policy(value: Any) -> MixedPrecisionPolicyRecord | None:
    data = _object(value, "mixed_precision_policy")
    if data is None:
        return None
    cast = data.get("cast_forward_inputs", True)
    if not isinstance(cast, bool):
        raise CheckpointError("training_step.json: 'mixed_precision_policy.cast_forward_inputs' must be a boolean")
    return MixedPrecisionPolicyRecord(
        param_dtype=_str(data, "param_dtype"),
        reduce_dtype=_str(data, "reduce_dtype"),
        output_dtype=_str(data, "output_dtype"),
        cast_forward_inputs=cast,
    )
