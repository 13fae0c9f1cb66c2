"""The parts of a checkpoint step directory: what each one is, and when a checkpoint holds it.

One declarative list, read by both halves of the project. The training core writes exactly
the parts it lists for the run being saved and loads them back through the containers it
names; ``inspect`` checks that the parts are there, and the resume prediction (``reshard-plan``,
``verify-resume``) says which of them a resume reads. What a checkpoint holds depends on the
run that saved it, as ``training_step.json`` records it (a :class:`Variant`)::

    <step>/
    ├── pretrained_model/
    │   ├── pytorch_model_fsdp_0/         DCP weight shards     sharded run, format dcp or safetensors_dcp
    │   ├── model.safetensors             gathered weights      format safetensors or safetensors_dcp, or not sharded
    │   ├── adapter_model.safetensors     the same, PEFT        (a PEFT run saves only its adapter)
    │   ├── config.json                   policy config         always
    │   ├── train_config.json             training config       always (a resume starts from it)
    │   ├── adapter_config.json           PEFT adapter config   PEFT
    │   └── policy_{pre,post}processor*   processors            written always, required never
    ├── pretrained_model_ema/             EMA weights as a policy  --ema.enable=true (LeRobot's directory)
    │   ├── pytorch_model_fsdp_0/         EMA shadow shards     as the model's DCP shards
    │   ├── model.safetensors             gathered EMA weights  as the model's gathered weights
    │   ├── config.json                   policy config         EMA
    │   └── policy_{pre,post}processor*   processors            written with EMA, required never
    └── training_state/
        ├── optimizer_0/                  DCP optimizer shards  sharded run
        ├── optimizer_state.safetensors   flat optimizer state  not sharded
        │   + optimizer_param_groups.json
        ├── rng_state.safetensors         every rank's RNG      always
        ├── scheduler_state.json          LR scheduler          always
        ├── scaler_state.json             fp16 loss scaler      fp16
        ├── ema_state.pt                  LeRobot's EMA state   EMA, not sharded
        ├── training_step.json            the record            always, the last part written
        └── save_files.json               the save's files      always (ckpt-train), written by the commit

:data:`PARTS` is in the order the training core writes them: ``training_step.json`` last, so
its presence means everything it describes is there. ``save_files.json`` is no part: the
commit lists in it every file the save wrote (``ckpt_tools.format.rules.save_files``). A loader takes the weights and the
optimizer state from the first container of :func:`weights_inputs` / :func:`optimizer_inputs`
that is present: DCP shards reshard onto any topology, so they win over a flat file.

Adding a part to a checkpoint is one entry here plus its save/load pair in
``ckpt_tools/train/checkpoint/parts.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ckpt_tools.errors import CkptError
from ckpt_tools.format import layout as L
from ckpt_tools.format import lerobot
from ckpt_tools.format.ema import checkpoint_has_ema
from ckpt_tools.format.layout import CheckpointFormat, StepPaths
from ckpt_tools.format.peft_keys import looks_like_adapter
from ckpt_tools.format.record import Topology, TrainingStep
from ckpt_tools.format.rules import load_parts
from ckpt_tools.format.rules.saved_format import saved_format
from ckpt_tools.format.train_config import SavedConfig
from ckpt_tools.io.safe_read import read_json_file

PM, TS = L.PRETRAINED_MODEL_DIR, L.TRAINING_STATE_DIR
CHOSEN = "chosen"  # Part.read of a container: read when the loader picks it (:func:`choose`)


@dataclass(frozen=True)
class Variant:
    """What decides which parts a checkpoint holds: the saving run's format, layout, PEFT, precision.

    Each property below is one condition a :class:`Part` names in ``when``.
    """

    format: CheckpointFormat = CheckpointFormat.SAFETENSORS
    sharded: bool = False
    peft: bool = False
    fp16: bool = False  # mixed precision fp16: the run has a loss scaler
    legacy: bool = False  # the 0.6.x layout: gathered weights, nothing resumable
    has_scheduler: bool = True  # LeRobot saves scheduler_state.json only for a run with a scheduler
    ema: bool = False  # the run kept an EMA shadow of the weights (--ema.enable=true)

    @classmethod
    def of(cls, record: TrainingStep, peft: bool, *, has_scheduler: bool = True, ema: bool | None = None) -> Variant:
        """The variant ``record`` describes (``peft`` from :func:`is_peft`). Unknown formats read as safetensors."""
        sharded = (
            record.sharded if record.sharded is not None else bool(record.topology and record.topology.layout.sharded)
        )
        try:
            fmt = CheckpointFormat(record.checkpoint_format or CheckpointFormat.SAFETENSORS.value)
        except ValueError:
            fmt = CheckpointFormat.SAFETENSORS
        fp16 = (record.mixed_precision or "").lower() == "fp16"
        ema = record.ema_steps is not None if ema is None else ema
        return cls(fmt, sharded, peft, fp16, record.is_legacy, has_scheduler, ema)

    @classmethod
    def at(cls, paths: StepPaths, record: TrainingStep, peft: bool) -> Variant:
        """The variant of the checkpoint at ``paths``: for a LeRobot record, its config says whether a scheduler ran."""
        return cls.of(
            record,
            peft,
            has_scheduler=not record.schema.lerobot or lerobot_scheduler(paths) is not False,
            ema=checkpoint_has_ema(paths, record),
        )

    @property
    def always(self) -> bool:
        return True

    @property
    def never(self) -> bool:
        return False

    @property
    def saved(self) -> CheckpointFormat:
        """The format the files follow (the saving rule: a non-sharded run saves one safetensors file)."""
        return saved_format(self.format, self.sharded)

    @property
    def _gathered(self) -> bool:
        return self.saved.has_gathered

    @property
    def gathered_model(self) -> bool:
        return self.legacy or (self._gathered and not self.peft)

    @property
    def gathered_adapter(self) -> bool:
        return not self.legacy and self._gathered and self.peft

    @property
    def dcp_model(self) -> bool:
        return not self.legacy and self.saved.has_dcp

    @property
    def sharded_optimizer(self) -> bool:
        return not self.legacy and self.sharded

    @property
    def flat_optimizer(self) -> bool:
        return not self.legacy and not self.sharded

    @property
    def resumable(self) -> bool:
        """State only a resume reads (a 0.6.x checkpoint cannot be resumed, so it is not required there)."""
        return not self.legacy

    @property
    def scheduler(self) -> bool:
        return self.resumable and self.has_scheduler

    @property
    def scaler(self) -> bool:
        return not self.legacy and self.fp16

    @property
    def ema_dcp(self) -> bool:
        return self.ema and self.dcp_model

    @property
    def ema_gathered(self) -> bool:
        return self.ema and self.gathered_model

    @property
    def ema_state(self) -> bool:
        """LeRobot's ``ema_state.pt``: written where LeRobot writes it, a run that is not sharded."""
        return self.ema and self.flat_optimizer


@dataclass(frozen=True)
class Resume:
    """What decides which of the checkpoint's state files a resume reads: the run it continues into."""

    same_world: bool = False  # the RNG state is per rank: restored only onto the same world size, else reseeded
    fp16: bool = False  # only an fp16 run has a loss scaler to restore
    lerobot: bool = False  # LeRobot's resume: one saved RNG state, loaded by every rank whatever the world size
    has_scheduler: bool = True  # LeRobot's resume reads scheduler_state.json only for a run with a scheduler

    @classmethod
    def of(
        cls, record: TrainingStep, world_size: int, mixed_precision: str | None, *, has_scheduler: bool = True
    ) -> Resume:
        saved_world = record.topology.world_size if record.topology is not None else None
        lerobot_run = record.schema.lerobot
        return cls(
            same_world=saved_world == world_size,
            fp16=not lerobot_run and (mixed_precision or "").lower() == "fp16",
            lerobot=lerobot_run,
            has_scheduler=has_scheduler,
        )

    @classmethod
    def at(cls, paths: StepPaths, record: TrainingStep, world_size: int, mixed_precision: str | None) -> Resume:
        """As :meth:`of`, for the checkpoint at ``paths`` (a LeRobot run's config says whether a scheduler ran)."""
        scheduler = not record.schema.lerobot or lerobot_scheduler(paths) is not False
        return cls.of(record, world_size, mixed_precision, has_scheduler=scheduler)

    @property
    def rng(self) -> bool:
        return self.same_world or self.lerobot

    @property
    def scheduler(self) -> bool:
        return self.has_scheduler

    @property
    def always(self) -> bool:
        return True

    @property
    def never(self) -> bool:
        return False


class Kind(str, enum.Enum):
    FILE = "file"  # files[...] are files
    DCP = "dcp"  # files[0] is a DCP directory; its .metadata says the save completed
    PREFIX = "prefix"  # files[...] are name prefixes (a part with a varying set of files)


@dataclass(frozen=True)
class Part:
    """One part of a checkpoint, saved and loaded as a unit.

    ``files`` are relative to the step dir; the first is the one whose presence says the part
    is there (for a DCP part: the directory, present once its ``.metadata`` is). ``when``
    names the :class:`Variant` condition under which a complete checkpoint holds it;
    ``written``, when given, the one under which the training core writes it (if that differs).
    ``read`` names the :class:`Resume` condition under which a resume reads it; ``"chosen"``
    marks a container a loader picks among alternatives (:func:`choose`).
    """

    key: str
    files: tuple[str, ...]
    what: str
    when: str
    kind: Kind = Kind.FILE
    written: str = ""
    read: str = "never"
    stand_ins: tuple[str, ...] = ()  # files that stand for files[0] in a complete checkpoint

    def __post_init__(self) -> None:
        for condition in (self.when, self.written or self.when):
            if condition.startswith("_") or not isinstance(getattr(Variant(), condition, None), bool):
                raise ValueError(f"part {self.key}: {condition!r} is not a Variant condition")
        if self.read != CHOSEN and (
            self.read.startswith("_") or not isinstance(getattr(Resume(), self.read, None), bool)
        ):
            raise ValueError(f"part {self.key}: {self.read!r} is not a Resume condition")

    @property
    def path(self) -> str:
        return self.files[0]

    @property
    def is_dcp(self) -> bool:
        return self.kind is Kind.DCP

    @property
    def name(self) -> str:
        """How messages name it: ``optimizer_0/``, ``model.safetensors``."""
        base = self.path.rsplit("/", 1)[-1]
        return f"{base}/" if self.is_dcp else base

    @property
    def marker(self) -> str:
        """The file whose presence means the part is there."""
        return f"{self.path}/{L.DCP_METADATA}" if self.is_dcp else self.path

    def required(self, variant: Variant) -> bool:
        return bool(getattr(variant, self.when))

    def writes(self, variant: Variant) -> bool:
        return bool(getattr(variant, self.written or self.when))

    def required_files(self) -> tuple[str, ...]:
        """The files that must exist when the part is required (a DCP part: its ``.metadata``)."""
        if self.kind is Kind.PREFIX:
            return ()
        return (self.marker, *self.files[1:])

    def present(self, step: StepPaths) -> bool:
        """The loader's test: is this part there to read (a DCP part: did its save complete)?"""
        return (step.root / self.marker).exists()

    def paths(self, step: StepPaths) -> tuple[Path, ...]:
        return tuple(step.root / f for f in self.files)

    def holds(self, name: str) -> bool:
        """Whether a file called ``name`` (in the part's directory) belongs to this part."""
        names = [f.rsplit("/", 1)[-1] for f in self.files]
        return any(name.startswith(n) for n in names) if self.kind is Kind.PREFIX else name in names


# The training core writes them in this order (collectives first, training_step.json last).
MODEL_DCP = Part("model_dcp", (f"{PM}/{L.MODEL_DCP_DIR}",), "DCP weight shards", "dcp_model", Kind.DCP, read=CHOSEN)
MODEL_WEIGHTS = Part(
    "model_weights",
    (f"{PM}/{L.MODEL_WEIGHTS}",),
    "gathered weights",
    "gathered_model",
    read=CHOSEN,
    stand_ins=(f"{PM}/{L.MODEL_WEIGHTS_INDEX}",),  # a sharded safetensors save: the index and its shards
)
ADAPTER_WEIGHTS = Part(
    "adapter_weights", (f"{PM}/{L.ADAPTER_WEIGHTS}",), "gathered PEFT adapter weights", "gathered_adapter", read=CHOSEN
)
OPTIMIZER_DCP = Part(
    "optimizer_dcp",
    (f"{TS}/{L.OPTIMIZER_DCP_DIR}",),
    "DCP optimizer shards",
    "sharded_optimizer",
    Kind.DCP,
    read=CHOSEN,
)
FLAT_OPTIMIZER = Part(
    "flat_optimizer",
    (f"{TS}/{L.OPTIMIZER_STATE}", f"{TS}/{L.OPTIMIZER_PARAM_GROUPS}"),
    "optimizer state and param groups",
    "flat_optimizer",
    read=CHOSEN,
)
RNG_STATE = Part("rng_state", (f"{TS}/{L.RNG_STATE}",), "RNG state", "always", read="rng")
POLICY_CONFIG = Part("policy_config", (f"{PM}/{L.POLICY_CONFIG}",), "policy config", "always")
TRAIN_CONFIG = Part("train_config", (f"{PM}/{L.TRAIN_CONFIG}",), "training config", "always", read="always")
ADAPTER_CONFIG = Part("adapter_config", (f"{PM}/{L.ADAPTER_CONFIG}",), "PEFT adapter config", "peft")
PROCESSORS = Part(
    "processors",
    (f"{PM}/{L.PREPROCESSOR}", f"{PM}/{L.POSTPROCESSOR}"),
    "policy processors",
    "never",
    Kind.PREFIX,
    written="always",
)
SCHEDULER_STATE = Part(
    "scheduler_state", (f"{TS}/{L.SCHEDULER_STATE}",), "LR scheduler state", "scheduler", read="scheduler"
)
SCALER_STATE = Part("scaler_state", (f"{TS}/{L.SCALER_STATE}",), "loss scaler state (fp16)", "scaler", read="fp16")
EMA_DIR = L.PRETRAINED_MODEL_EMA_DIR
EMA_DCP = Part("ema_dcp", (f"{EMA_DIR}/{L.MODEL_DCP_DIR}",), "EMA shadow shards", "ema_dcp", Kind.DCP, read=CHOSEN)
EMA_WEIGHTS = Part(
    "ema_weights", (f"{EMA_DIR}/{L.MODEL_WEIGHTS}",), "gathered EMA weights", "ema_gathered", read=CHOSEN
)
EMA_POLICY_CONFIG = Part("ema_policy_config", (f"{EMA_DIR}/{L.POLICY_CONFIG}",), "EMA policy config", "ema")
EMA_PROCESSORS = Part(
    "ema_processors",
    (f"{EMA_DIR}/{L.PREPROCESSOR}", f"{EMA_DIR}/{L.POSTPROCESSOR}"),
    "EMA policy processors",
    "never",
    Kind.PREFIX,
    written="ema",
)
EMA_STATE = Part("ema_state", (f"{TS}/{L.EMA_STATE}",), "EMA state (LeRobot's ema_state.pt)", "ema_state", read=CHOSEN)
TRAINING_STEP = Part("training_step", (f"{TS}/{L.TRAINING_STEP}",), "topology record", "always", read="always")

PARTS: tuple[Part, ...] = (
    MODEL_DCP,
    MODEL_WEIGHTS,
    ADAPTER_WEIGHTS,
    OPTIMIZER_DCP,
    FLAT_OPTIMIZER,
    RNG_STATE,
    POLICY_CONFIG,
    TRAIN_CONFIG,
    ADAPTER_CONFIG,
    PROCESSORS,
    SCHEDULER_STATE,
    SCALER_STATE,
    EMA_DCP,
    EMA_WEIGHTS,
    EMA_POLICY_CONFIG,
    EMA_PROCESSORS,
    EMA_STATE,
    TRAINING_STEP,
)


def required_parts(variant: Variant | None) -> tuple[Part, ...]:
    """The parts a complete checkpoint of ``variant`` holds (None: the run is unknown, only the universal ones)."""
    if variant is None:
        return tuple(p for p in PARTS if p.when == "always")
    return tuple(p for p in PARTS if p.required(variant))


def written_parts(variant: Variant) -> tuple[Part, ...]:
    """The parts the training core writes for a run of ``variant``, in the order it writes them."""
    return tuple(p for p in PARTS if p.writes(variant))


# ====================================================================== what a loader reads


def weights_inputs(peft: bool) -> tuple[Part, Part]:
    """Where the weights come from, in the loader's order: DCP shards, else the gathered file."""
    return (MODEL_DCP, ADAPTER_WEIGHTS if peft else MODEL_WEIGHTS)


def ema_inputs() -> tuple[Part, Part, Part]:
    """Where the EMA shadow comes from, in the loader's order: DCP shards, the gathered file, LeRobot's ema_state.pt."""
    return (EMA_DCP, EMA_WEIGHTS, EMA_STATE)


def optimizer_inputs() -> tuple[Part, Part]:
    """Where the optimizer state comes from, in the loader's order: DCP shards, else the flat files."""
    return (OPTIMIZER_DCP, FLAT_OPTIMIZER)


def choose(inputs: tuple[Part, ...], step: StepPaths) -> Part | None:
    """The first of ``inputs`` present in ``step``: the one a loader reads (None: none is)."""
    return next((p for p in inputs if p.present(step)), None)


def dcp_inputs(step: StepPaths) -> tuple[Part, ...]:
    """The DCP directories a loader reads from ``step``: the weights', the optimizer's and the EMA shadow's, where chosen.

    DCP shards are every state's first choice, whether the run is PEFT or not.
    """
    chosen = (choose(weights_inputs(peft=False), step), choose(optimizer_inputs(), step), choose(ema_inputs(), step))
    return tuple(p for p in chosen if p is not None and p.is_dcp)


def gathered_weights(peft: bool) -> Part:
    """The one-file form of the weights: ``adapter_model.safetensors`` for a PEFT run."""
    return weights_inputs(peft)[1]


def no_weights_reason(step: StepPaths, peft: bool) -> str:
    """Why a loader finds no weights in ``step`` (neither container present), in one line."""
    dcp, gathered = weights_inputs(peft)
    incomplete = (
        f" ({dcp.name} has no {L.DCP_METADATA}: its save did not complete)" if (step.root / dcp.path).is_dir() else ""
    )
    return f"{step.pretrained_model}: neither {dcp.name} nor {gathered.name}{incomplete} - no weights to resume"


def no_optimizer_reason(step: StepPaths, sharded: bool) -> str:
    """Why a loader finds no optimizer state in ``step`` (neither container present), in one line."""
    dcp, flat = optimizer_inputs()
    if (step.root / dcp.path).is_dir():
        return (
            f"{step.root / dcp.path}: no {L.DCP_METADATA} - the optimizer save did not complete"
            f" (and no {flat.name} to fall back on)"
        )
    if sharded:
        return f"{step.training_state}: no {dcp.name} - a sharded run's optimizer state is missing"
    return f"{step.training_state}: no optimizer state ({dcp.name} or {flat.name})"


def part_containers(part: str, *, fp16: bool) -> tuple[Part, ...]:
    """The parts a load of ``part`` (a :mod:`~ckpt_tools.format.rules.load_parts` name) may read
    (the weights and optimizer: whichever is present)."""
    return {
        load_parts.MODEL: weights_inputs(False),
        load_parts.OPTIMIZER: optimizer_inputs(),
        load_parts.SCHEDULER: (SCHEDULER_STATE,),
        load_parts.SCALER: (SCALER_STATE,) if fp16 else (),
        load_parts.RNG: (RNG_STATE,),
    }[part]


def resume_reads(resume: Resume) -> tuple[Part, ...]:
    """The state parts a resume reads whole, besides the weights and optimizer containers it chooses."""
    return tuple(p for p in PARTS if p.read != CHOSEN and getattr(resume, p.read))


# ====================================================================== the record, completed by the files


def derives_topology(record: TrainingStep) -> bool:
    """Whether the topology of ``record`` (a LeRobot 0.6.x one) comes from its flat optimizer state's keys."""
    return record.schema.lerobot and record.topology is None and bool(record.legacy_num_processes)


def complete_record(paths: StepPaths, record: TrainingStep, *, flat_optimizer_by_name: bool | None) -> TrainingStep:
    """Fill in, from the files, what a LeRobot record leaves out (each named in ``record.derived``).

    ``flat_optimizer_by_name``: where :func:`derives_topology`, whether the flat optimizer state
    is keyed by parameter name (None: cannot tell); :func:`ckpt_tools.facts.record.read_record`
    reads it and calls this.

    - a 0.6.x record's topology: ``num_processes`` processes, sharded (FSDP) when the flat
      optimizer state is keyed by parameter name - what LeRobot 0.6.x's FSDP save wrote - and
      replicated (DDP, or one process) when it is keyed by position
      (:func:`ckpt_tools.format.lerobot.keyed_by_name`);
    - a LeRobot record's checkpoint format: ``dcp`` when ``pytorch_model_fsdp_0/`` holds the
      weights alone, ``safetensors_dcp`` when ``model.safetensors`` is there too, else
      ``safetensors``.

    A ``ckpt-train`` record says all of this itself and is returned as it is.
    """
    if not record.schema.lerobot:
        return record
    changes: dict[str, object] = {}
    derived = list(record.derived)
    if derives_topology(record) and record.legacy_num_processes:
        by_name = flat_optimizer_by_name
        if by_name is not None:
            n = record.legacy_num_processes
            changes["topology"] = Topology(n, 1, n) if by_name else Topology(n, n, 1)
            changes["sharded"] = by_name
            derived += ["topology", "sharded"]
    if record.checkpoint_format is None:
        has_dcp = (paths.model_dcp / L.DCP_METADATA).exists()
        if has_dcp and (paths.model_weights.exists() or (paths.pretrained_model / L.MODEL_WEIGHTS_INDEX).exists()):
            fmt = CheckpointFormat.SAFETENSORS_DCP
        else:
            fmt = CheckpointFormat.DCP if has_dcp else CheckpointFormat.SAFETENSORS
        changes["checkpoint_format"] = fmt.value
        derived.append("checkpoint_format")
    return record.completed(derived=tuple(derived), **changes)


def lerobot_scheduler(paths: StepPaths) -> bool | None:
    """Whether a LeRobot run saved an LR scheduler state, as its ``train_config.json`` says (None: it does not say)."""
    try:
        config = read_json_file(paths.train_config, want_object=True)
    except CkptError:
        return None
    return lerobot.saves_scheduler(config)


# ====================================================================== is this PEFT


def is_peft(
    pretrained_model: Path | None,
    *,
    config: SavedConfig | None = None,
    record: TrainingStep | None = None,
    weight_names: Iterable[str] = (),
) -> bool:
    """Whether a checkpoint is a PEFT one: the one rule for the trainer's records and every tool.

    A PEFT checkpoint holds only the adapter (``adapter_model.safetensors``, under peft's saved
    names) and resumes by training that adapter on its base model. The evidence, strongest first:

    - ``config``, the ``train_config.json`` a resume starts from, when the question is what the
      resumed run will be (the training core builds that model from it: its ``peft`` group);
    - ``record``: ``training_step.json``'s ``peft``, the saving run's own word;
    - the files peft's ``save_pretrained`` leaves in ``pretrained_model/``;
    - ``weight_names`` that only an adapter has (LoRA keys, nothing else), for a loose DCP dir.
    """
    if config is not None:
        return config.peft
    if record is not None and record.peft is not None:
        return record.peft
    if pretrained_model is not None and any(
        (pretrained_model / name).exists() for name in (L.ADAPTER_CONFIG, L.ADAPTER_WEIGHTS)
    ):
        return True
    return looks_like_adapter(list(weight_names))
