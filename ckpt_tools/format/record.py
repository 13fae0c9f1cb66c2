"""The topology record ``training_step.json`` and the batch arithmetic built on it.

The record says where a run was (step, samples seen, sampler position) and on what it ran
(world size, ``dp_replicate × dp_shard``, precision, checkpoint format), so that a resume -
or a tool deciding whether a resume can work - never has to guess. It carries a schema
version; older or foreign records still parse, and :attr:`TrainingStep.unknown` lists what
they could not tell. Three schemas are read (:class:`RecordSchema`):

- ``ckpt-train``'s own (``schema_version``, ``topology``, ``samples_seen``, ...);
- LeRobot main's (``src/lerobot/common/train_utils.py`` ``save_training_metadata``):
  ``{step, dp_world_size, batch_size, grad_accum_steps, parallelism: {dp_replicate, dp_shard,
  ring_degree, ulysses_degree}}`` - the topology comes from ``parallelism``;
- LeRobot 0.6.x's (``lerobot/common/train_utils.py`` ``save_training_step``): ``{step,
  num_processes, batch_size}`` for every run, single, DDP or FSDP alike - whether it was
  sharded only the files tell (:func:`ckpt_tools.facts.record.read_record` completes it).

LeRobot records no data position: ``samples_seen`` is derived by LeRobot's own rule
(:mod:`ckpt_tools.format.rules.sampler_position`) and named in :attr:`TrainingStep.derived`.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ckpt_tools.errors import CheckpointError
from ckpt_tools.io.remote import as_path
from ckpt_tools.io.safe_read import read_json_file

SCHEMA_VERSION = 1
SAVE_ID_KEY = "save_id"  # the save's stamp (ckpt_tools.format.rules.save_stamps.KEY): declared, not an unknown extra


class RecordSchema(str, enum.Enum):
    """Which trainer's ``training_step.json`` a record is, told by its keys."""

    CKPT_TRAIN = "ckpt-train"  # schema_version, topology, samples_seen, ... (or a bare/foreign record)
    LEROBOT = "lerobot"  # LeRobot main: a parallelism snapshot
    LEGACY = "0.6.x"  # LeRobot 0.6.x: num_processes (and batch_size), nothing else

    @property
    def lerobot(self) -> bool:
        """Whether LeRobot's rules apply: the data position is derived, not recorded."""
        return self is not RecordSchema.CKPT_TRAIN

    @classmethod
    def of(cls, data: dict[str, Any]) -> RecordSchema:
        if "schema_version" in data or "topology" in data:
            return cls.CKPT_TRAIN
        if "parallelism" in data:
            return cls.LEROBOT
        if "num_processes" in data:
            return cls.LEGACY
        return cls.CKPT_TRAIN


# The fields each schema records: what a record of it can lack (the rest it never holds).
_CKPT_TRAIN_FIELDS = (
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
_LEROBOT_FIELDS = ("samples_seen", "dp_world_size", "batch_size", "grad_accum_steps", "topology")


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
    # EMA updates the saved shadow holds (diffusers' ``optimization_step``); None: the run kept no EMA.
    ema_steps: int | None = None
    versions: dict[str, str] = field(default_factory=dict)
    # A run started from another run's checkpoint parts (--checkpoint.load_from): that checkpoint's
    # path, step, save id and the parts loaded (ckpt_tools.format.rules.load_parts); None otherwise.
    initialized_from: dict[str, Any] | None = None
    schema_version: int | None = SCHEMA_VERSION
    # Filled by from_dict: what the record did not say, and keys it had that we do not know.
    unknown: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    legacy_num_processes: int | None = None
    schema: RecordSchema = RecordSchema.CKPT_TRAIN
    derived: tuple[str, ...] = ()  # fields not in the file, computed by LeRobot's rules (or from the files)

    @property
    def is_legacy(self) -> bool:
        """The 0.6.x-era record: ``num_processes`` (and ``batch_size``), no topology of its own."""
        return self.schema is RecordSchema.LEGACY

    @property
    def batch(self) -> BatchFactorization | None:
        if None in (self.batch_size, self.dp_world_size, self.grad_accum_steps):
            return None
        assert self.batch_size is not None and self.dp_world_size is not None
        assert self.grad_accum_steps is not None
        return BatchFactorization(self.batch_size, self.dp_world_size, self.grad_accum_steps)

    def to_dict(self) -> dict[str, Any]:
        version = SCHEMA_VERSION if self.schema is RecordSchema.CKPT_TRAIN else self.schema_version
        out: dict[str, Any] = {"schema_version": version}
        for f in fields(self):
            if f.name in ("unknown", "extra", "legacy_num_processes", "schema_version", "schema", "derived"):
                continue
            value = getattr(self, f.name)
            if f.name == "initialized_from" and value is None:
                continue  # only a run started from another's parts records one
            out[f.name] = asdict(value) if hasattr(value, "__dataclass_fields__") else value
        if self.topology is not None:
            out["topology"]["layout"] = self.topology.layout.value
            out["parallelism"] = lerobot_parallelism(self.topology)
        if self.batch is not None:
            out["effective_batch_size"] = self.batch.effective_batch_size
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingStep:
        """Parse any record we may meet: ``ckpt-train``'s, LeRobot main's or LeRobot 0.6.x's."""
        if not isinstance(data, dict):
            raise CheckpointError("training_step.json: expected a JSON object")
        if "step" not in data:
            raise CheckpointError("training_step.json: no 'step' field")
        step = _int(data, "step")
        if step is None:
            raise CheckpointError("training_step.json: 'step' is null")
        schema = RecordSchema.of(data)
        known = {f.name for f in fields(cls)} | {"effective_batch_size", "num_processes", "parallelism", SAVE_ID_KEY}
        legacy = _int(data, "num_processes") if "num_processes" in data else None
        topology = _topology(data.get("topology")) if schema is RecordSchema.CKPT_TRAIN else _parallelism(data)
        if schema is RecordSchema.CKPT_TRAIN and "parallelism" in data:
            _same_mesh(topology, _parallelism(data))
        dp_world_size = _int(data, "dp_world_size")
        if dp_world_size is None:
            dp_world_size = topology.dp_world_size if topology is not None else legacy
        elif schema is RecordSchema.LEROBOT and topology is not None and dp_world_size != topology.dp_world_size:
            raise CheckpointError(
                f"training_step.json: dp_world_size {dp_world_size}, but the parallelism"
                f" {topology.dp_replicate}×{topology.dp_shard} makes {topology.dp_world_size}"
            )
        grad_accum = _int(data, "grad_accum_steps")
        derived: list[str] = []
        if grad_accum is None and schema is RecordSchema.LEGACY:
            grad_accum = 1  # LeRobot 0.6.x had no gradient accumulation
            derived.append("grad_accum_steps")
        record = cls(
            step=step,
            samples_seen=_int(data, "samples_seen"),
            optimizer_steps=_int(data, "optimizer_steps"),
            adam_step=_int(data, "adam_step"),
            dp_world_size=dp_world_size,
            batch_size=_int(data, "batch_size"),
            grad_accum_steps=grad_accum,
            mixed_precision=_str(data, "mixed_precision"),
            mixed_precision_policy=_policy(data.get("mixed_precision_policy")),
            checkpoint_format=_str(data, "checkpoint_format"),
            topology=topology,
            sampler=_sampler(data.get("sampler")),
            sharded=_bool(data, "sharded"),
            peft=_bool(data, "peft"),
            ema_steps=_int(data, "ema_steps"),
            versions={str(k): str(v) for k, v in (data.get("versions") or {}).items()}
            if isinstance(data.get("versions"), dict)
            else {},
            initialized_from=_initialized_from(data.get("initialized_from")),
            schema_version=_int(data, "schema_version"),
            extra={k: v for k, v in data.items() if k not in known},
            legacy_num_processes=legacy,
            schema=schema,
        )
        if schema.lerobot:
            record = _lerobot_derived(record, derived)
        return record.completed(derived=tuple(derived))

    def completed(self, **changes: Any) -> TrainingStep:
        """This record with ``changes`` applied (fields the files tell, :attr:`derived`), ``unknown`` recomputed."""
        record = replace(self, **changes)
        names = _CKPT_TRAIN_FIELDS if self.schema is RecordSchema.CKPT_TRAIN else _LEROBOT_FIELDS
        if self.schema is RecordSchema.LEGACY:
            names = _CKPT_TRAIN_FIELDS
        missing = tuple(n for n in names if getattr(record, n) is None and n not in record.derived)
        return replace(record, unknown=missing)

    def unknown_summary(self) -> str | None:
        """One line saying what this record could not tell, or None if it is complete."""
        if not self.unknown:
            return None
        origin = {
            RecordSchema.LEGACY: "0.6.x-era record (num_processes)",
            RecordSchema.LEROBOT: "LeRobot record",
        }.get(self.schema, "record")
        return f"{origin} does not say: {', '.join(self.unknown)}"

    def describe_derived(self) -> str | None:
        """One line naming the fields LeRobot's rules (or the files) gave, or None when there are none."""
        if not self.derived:
            return None
        shown = []
        for name in self.derived:
            value = getattr(self, name)
            if name == "samples_seen":
                shown.append(f"samples_seen {value} (step × batch_size × dp_world_size, LeRobot's rule)")
            elif name == "topology" and value is not None:
                shown.append(f"topology {value.describe()} (num_processes, and the files)")
            elif name == "checkpoint_format":
                shown.append(f"checkpoint_format {value} (the files)")
            elif name != "sharded":  # said by the topology
                shown.append(f"{name} {value}")
        return f"not in training_step.json, derived: {', '.join(shown)}"


def _lerobot_derived(record: TrainingStep, derived: list[str]) -> TrainingStep:
    """What LeRobot computes on resume from its record: the data position (its sampler rule)."""
    # Imported here: the rules package imports this module.
    from ckpt_tools.format.rules.sampler_position import samples_seen as lerobot_samples_seen

    if record.sharded is None and record.topology is not None:
        record = replace(record, sharded=record.topology.layout.sharded)
    if record.samples_seen is None and record.batch_size is not None and record.dp_world_size is not None:
        derived.append("samples_seen")
        return replace(record, samples_seen=lerobot_samples_seen(record.step, record.batch_size, record.dp_world_size))
    return record


def read_training_step(path: str | os.PathLike[str]) -> TrainingStep:
    p = as_path(path)
    data = read_json_file(p, missing="missing (every checkpoint's training_state/ has one)")
    try:
        return TrainingStep.from_dict(data)
    except CheckpointError as e:
        raise CheckpointError(f"{p}: {str(e).removeprefix('training_step.json: ')}") from None


def training_step_json(record: TrainingStep, save_id: str | None = None) -> str:
    """The record as ``ckpt-train`` writes it; ``save_id``: stamped with its save (``format.rules.save_stamps``)."""
    doc = record.to_dict()
    if save_id is not None:
        doc[SAVE_ID_KEY] = save_id
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


# --- field coercion: a foreign record gets one clear line, never a traceback -----------------


def _show(value: Any) -> str:
    """A value for a one-line message: a hostile record may hold megabytes in one field."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


# Factors of the batch and of the world: every one of them is divided by somewhere, and none of
# them can be 0 in a run that trained.
POSITIVE = frozenset({"dp_world_size", "batch_size", "grad_accum_steps", "num_processes"})


def _int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    least = 1 if key in POSITIVE else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "a positive" if least else "a non-negative"
        raise CheckpointError(f"training_step.json: '{key}' must be {kind} integer, got {_show(value)}")
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


def _initialized_from(value: Any) -> dict[str, Any] | None:
    """``initialized_from``: where a run's starting parts came from (a path, a step, a save id, part names)."""
    data = _object(value, "initialized_from")
    if data is None:
        return None
    parts = data.get("parts")
    if (
        not isinstance(data.get("path"), str)
        or not isinstance(parts, list)
        or not all(isinstance(p, str) for p in parts)
    ):
        raise CheckpointError("training_step.json: 'initialized_from' needs a string path and a list of part names")
    save_id = data.get("save_id")
    return {
        "path": data["path"],
        "step": _int(data, "step"),
        "save_id": save_id if isinstance(save_id, str) else None,
        "parts": list(parts),
    }


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


def lerobot_parallelism(topology: Topology) -> dict[str, int]:
    """LeRobot main's ``parallelism`` snapshot of a topology, written next to ours so LeRobot reads it.

    ckpt-train has no context parallelism: its ring and Ulysses degrees are always 1.
    """
    return {"dp_replicate": topology.dp_replicate, "dp_shard": topology.dp_shard, "ring_degree": 1, "ulysses_degree": 1}


def _same_mesh(topology: Topology | None, snapshot: Topology | None) -> None:
    """A ckpt-train record's LeRobot ``parallelism`` must say the mesh its ``topology`` says."""
    if topology is None or snapshot is None:
        return
    if (topology.dp_replicate, topology.dp_shard) != (snapshot.dp_replicate, snapshot.dp_shard):
        raise CheckpointError(
            f"training_step.json: 'parallelism' {snapshot.dp_replicate}×{snapshot.dp_shard} disagrees with"
            f" 'topology' {topology.dp_replicate}×{topology.dp_shard}"
        )


def _parallelism(data: dict[str, Any]) -> Topology | None:
    """LeRobot main's parallelism snapshot as a topology (every process is one data-parallel worker)."""
    snapshot = _object(data.get("parallelism"), "parallelism")
    if snapshot is None:
        return None
    degrees = {}
    for key in ("dp_replicate", "dp_shard", "ring_degree", "ulysses_degree"):
        value = _int(snapshot, key) if key in snapshot else 1
        if value is None or value < 1:
            raise CheckpointError(f"training_step.json: 'parallelism.{key}' must be a positive integer")
        degrees[key] = value
    cp = degrees["ring_degree"] * degrees["ulysses_degree"]
    if cp != 1:
        raise CheckpointError(
            f"training_step.json: context parallelism (ring_degree × ulysses_degree = {cp}): only"
            " dp_replicate × dp_shard meshes are read here (LeRobot refuses context parallelism in training too)"
        )
    r, s = degrees["dp_replicate"], degrees["dp_shard"]
    return Topology(world_size=r * s, dp_replicate=r, dp_shard=s)


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
