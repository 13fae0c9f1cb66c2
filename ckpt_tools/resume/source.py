"""What a checkpoint offers a resume, chosen by the rule the training core's loader follows.

The loader takes the weights and the optimizer state from the first container present of
:func:`ckpt_tools.format.manifest.weights_inputs` / :func:`~ckpt_tools.format.manifest.optimizer_inputs`
(DCP shards, else the gathered / flat files); :func:`load_source` asks the same functions, then
describes the state the resumed model will hold - every parameter (shape, dtype, trainable or
frozen) and every optimizer tensor - from metadata and headers only. The plan and the verifier
both start here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ckpt_tools.dcp import validate
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.errors import CkptError
from ckpt_tools.facts.record import read_record
from ckpt_tools.format import layout as L
from ckpt_tools.format import lerobot, manifest
from ckpt_tools.format.param_groups import position_names, split_flat_key
from ckpt_tools.format.peft_keys import saved_adapter_key
from ckpt_tools.format.policy_path import locate_policy
from ckpt_tools.format.record import TrainingStep
from ckpt_tools.format.rules.resumable import Trainer, checkpoint_trainer
from ckpt_tools.format.train_config import SavedConfig, read_saved_config
from ckpt_tools.st import dtypes
from ckpt_tools.st.header import SafetensorsHeader, read_header


@dataclass(frozen=True)
class SavedTensor:
    """A tensor the checkpoint holds for the resumed model (a parameter or an optimizer slot)."""

    name: str  # parameter name (for optimizer state: the parameter's name too)
    shape: tuple[int, ...]
    dtype: str  # torch name, e.g. float32
    itemsize: int
    key: str = ""  # where it is stored: the DCP flat key or the safetensors key

    @property
    def numel(self) -> int:
        return dtypes.numel(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass
class Container:
    """One input the loader reads: a DCP directory (``index``) or a safetensors file (``header``)."""

    part: manifest.Part  # which of the manifest's containers it is
    path: Path
    index: ChunkIndex | None = None
    header: SafetensorsHeader | None = None
    problems: list[str] = field(default_factory=list)  # what makes loading it fail


@dataclass
class ResumeSource:
    paths: L.StepPaths
    record: TrainingStep
    config: SavedConfig | None
    config_error: str | None
    peft: bool
    weights: Container | None  # None: no usable weights (``weights_error`` says why)
    weights_error: str | None
    optimizer: Container | None
    optimizer_error: str | None
    params: dict[str, SavedTensor]  # live parameter name -> spec, from the weights container
    trainable: set[str]
    frozen: dict[str, SavedTensor]  # PEFT: the base model's parameters, read from policy.path
    optimizer_state: dict[str, dict[str, SavedTensor]]  # live parameter name -> slot -> spec
    base_weights: Path | None = None
    notes: list[str] = field(default_factory=list)
    trainer: Trainer = Trainer.CKPT_TRAIN  # whose checkpoint it is (checkpoint_trainer): who resumes it by default

    @property
    def positional(self) -> bool:
        """The optimizer state is keyed by position in the optimizer (LeRobot's unsharded form), not by name."""
        return bool(self.optimizer_state) and all(lerobot.is_position(n) for n in self.optimizer_state)

    def param_of(self, optimizer_name: str) -> SavedTensor | None:
        """The parameter an optimizer entry belongs to (PEFT safetensors names drop the adapter name)."""
        return self.params.get(optimizer_name) or self.params.get(saved_adapter_key(optimizer_name))


# ====================================================================== loading


def load_source(paths: L.StepPaths) -> ResumeSource:
    """Describe ``paths`` as the loader sees it. Raises only when ``training_step.json`` is unusable."""
    record = read_record(paths)
    config, config_error = None, None
    try:
        config = read_saved_config(paths.train_config)
    except CkptError as e:
        config_error = str(e)
    peft = manifest.is_peft(paths.pretrained_model, config=config, record=record)
    weights, weights_error = _weights(paths, peft)
    optimizer, optimizer_error = _optimizer(paths, record)
    source = ResumeSource(
        paths=paths,
        record=record,
        config=config,
        config_error=config_error,
        peft=peft,
        weights=weights,
        weights_error=weights_error,
        optimizer=optimizer,
        optimizer_error=optimizer_error,
        params={},
        trainable=set(),
        frozen={},
        optimizer_state={},
        trainer=checkpoint_trainer(paths, record),
    )
    if weights is not None:
        source.params = _params(weights)
        source.trainable = set(source.params)  # non-PEFT: all trainable; PEFT: the checkpoint holds only the adapter
    if optimizer is not None:
        source.optimizer_state = _optimizer_state(optimizer)
    if source.trainer is Trainer.LEROBOT and source.optimizer_state and not source.positional:
        # LeRobot's model state holds buffers too (ACT's vae_encoder_pos_enc): what has no optimizer
        # state is no trainable parameter - no gradient, no Adam moments, not sharded by FSDP2.
        source.trainable = {n for n in source.params if n in source.optimizer_state}
    if peft:
        _base_model(source)
    return source


def _weights(paths: L.StepPaths, peft: bool) -> tuple[Container | None, str | None]:
    chosen = manifest.choose(manifest.weights_inputs(peft), paths)
    if chosen is None:
        return None, manifest.no_weights_reason(paths, peft)
    return _container(chosen, paths), None


def _optimizer(paths: L.StepPaths, record: TrainingStep) -> tuple[Container | None, str | None]:
    chosen = manifest.choose(manifest.optimizer_inputs(), paths)
    if chosen is None:
        return None, manifest.no_optimizer_reason(paths, bool(record.sharded))
    return _container(chosen, paths), None


def _container(part: manifest.Part, paths: L.StepPaths) -> Container:
    """The chosen input, read from its metadata or header; the files read with it must exist too."""
    main, *companions = part.paths(paths)
    container = _dcp(part, main) if part.is_dcp else _safetensors(part, main)
    container.problems += [f"{c}: missing ({part.what})" for c in companions if not c.exists()]
    return container


def _dcp(part: manifest.Part, directory: Path) -> Container:
    try:
        index = ChunkIndex.load(directory)
    except CkptError as e:
        return Container(part, directory, problems=[str(e)])
    found = validate.problems(index)
    return Container(part, directory, index=index, problems=[validate.summary(found)] if found else [])


def _safetensors(part: manifest.Part, file: Path) -> Container:
    try:
        header = read_header(file)
    except CkptError as e:
        return Container(part, file, problems=[str(e)])
    return Container(part, file, header=header, problems=list(header.problems))


# ====================================================================== inventories


def _params(weights: Container) -> dict[str, SavedTensor]:
    out: dict[str, SavedTensor] = {}
    if weights.index is not None:
        for entry in weights.index.tensors.values():
            name = _below(entry.path, L.MODEL_DCP_KEY, entry.fqn)
            if name is not None:
                out[name] = SavedTensor(name, entry.shape, entry.dtype, entry.itemsize or 0, entry.fqn)
    elif weights.header is not None:
        out = _header_specs(weights.header)
    return out


def _below(path: tuple[str | int, ...], top: str, fqn: str) -> str | None:
    """The name under a top-level key: ('model', 'a.b') -> 'a.b' (or from the flat fqn)."""
    if len(path) > 1 and path[0] == top:
        return ".".join(str(p) for p in path[1:])
    prefix = f"{top}."
    return fqn[len(prefix) :] if fqn.startswith(prefix) else None


def _header_specs(header: SafetensorsHeader) -> dict[str, SavedTensor]:
    out = {}
    for e in header.entries.values():
        dtype = dtypes.BY_SAFETENSORS.get(e.dtype)
        itemsize = dtype.itemsize if dtype else 0
        out[e.name] = SavedTensor(e.name, e.shape, dtype.name if dtype else e.dtype, itemsize, e.name)
    return out


def _optimizer_state(optimizer: Container) -> dict[str, dict[str, SavedTensor]]:
    out: dict[str, dict[str, SavedTensor]] = {}
    if optimizer.index is not None:
        for entry in optimizer.index.tensors.values():
            path = entry.path
            if len(path) >= 4 and path[0] == L.OPTIMIZER_DCP_KEY and path[1] == "state":
                name, slot = ".".join(str(p) for p in path[2:-1]), str(path[-1])
                spec = SavedTensor(name, entry.shape, entry.dtype, entry.itemsize or 0, entry.fqn)
                out.setdefault(name, {})[slot] = spec
    elif optimizer.header is not None:
        try:
            names = position_names(optimizer.header.metadata, optimizer.header.path)
        except CkptError:
            names = None  # the optimizer-coverage check reports it
        for key, spec in _header_specs(optimizer.header).items():
            # Split exactly as the loader does: a key it cannot place (no "state." prefix, an
            # unknown parameter) shows up as state of a name the param groups do not list.
            name, slot = split_flat_key(key, names)
            out.setdefault(name, {})[slot] = SavedTensor(name, spec.shape, spec.dtype, spec.itemsize, key)
    return out


def _base_model(source: ResumeSource) -> None:
    """PEFT: the frozen base the resumed model rebuilds from ``policy.path`` (resident, never in the checkpoint)."""
    path = source.config.policy_path if source.config else None
    if not path:
        source.notes.append("PEFT run without --policy.path: no base model to count (the resume refuses it)")
        return
    try:
        located = locate_policy(path)  # as the resume resolves --policy.path
    except CkptError as e:
        source.notes.append(f"PEFT base {e}; its memory is not counted")
        return
    if not isinstance(located, Path):
        source.notes.append(f"PEFT base {path}: a Hub id, not read here; its memory is not counted")
        return
    base = located / manifest.gathered_weights(peft=False).name  # the full model a PEFT run adapts
    try:
        header = read_header(base)
    except CkptError:
        source.notes.append(f"PEFT base {base}: not readable here; its memory is not counted")
        return
    source.base_weights = base
    source.frozen = _header_specs(header)
