"""The checkpoint layout (docs/checkpoint-format.md): every file and directory name, defined once.

Both halves of the project go through this module: the training core writes with these
names, and the tools find things with them. Discovery (:func:`locate`) turns whatever path
a user typed (checkpoints root, ``last``, a step dir, ``pretrained_model/``, a DCP dir or a
``.safetensors`` file or a folder of them) into a :class:`Located` record saying what it is; :func:`resolve_step`
turns it into the one step directory a resume, a conversion or a push reads.

    checkpoints/
    ├── 005000/
    │   ├── pretrained_model/   config.json, train_config.json, model.safetensors,
    │   │                       pytorch_model_fsdp_0/, policy_{pre,post}processor*.…
    │   ├── pretrained_model_ema/  the same for the EMA weights (--ema.enable=true)
    │   └── training_state/     optimizer_*, rng_state, scheduler, scaler, ema_state.pt, training_step.json
    └── last -> 005000      (a symlink; or a pointer file holding "005000")
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ckpt_tools.errors import CheckpointError
from ckpt_tools.io.remote import as_path, remote_file

# Directories
CHECKPOINTS_DIR = "checkpoints"
LAST_LINK = "last"
PRETRAINED_MODEL_DIR = "pretrained_model"
TRAINING_STATE_DIR = "training_state"
# The EMA shadow of the weights as a loadable policy, beside pretrained_model/ (LeRobot main's
# f"{PRETRAINED_MODEL_DIR}_ema", written when --ema.enable=true): the same files, EMA weights.
PRETRAINED_MODEL_EMA_DIR = f"{PRETRAINED_MODEL_DIR}_ema"

# pretrained_model/
POLICY_CONFIG = "config.json"
TRAIN_CONFIG = "train_config.json"
MODEL_WEIGHTS = "model.safetensors"
MODEL_WEIGHTS_INDEX = "model.safetensors.index.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
MODEL_DCP_DIR = "pytorch_model_fsdp_0"  # accelerate's FSDP_MODEL_NAME + "_0"
MODEL_DCP_KEY = "model"  # top-level key inside the model DCP state dict (accelerate's)
PREPROCESSOR = "policy_preprocessor"
POSTPROCESSOR = "policy_postprocessor"

# training_state/
OPTIMIZER_DCP_DIR = "optimizer_0"  # accelerate's OPTIMIZER_NAME + "_0"
OPTIMIZER_DCP_KEY = "optimizer"
OPTIMIZER_PARAM_GROUPS = "optimizer_param_groups.json"
OPTIMIZER_STATE = "optimizer_state.safetensors"
# OPTIMIZER_STATE keys ckpt-train wrote before it wrote LeRobot's (read only): state.<parameter name>.<slot>
FLAT_OPTIMIZER_PREFIX = "state."
# LeRobot's OPTIMIZER_STATE keys, which ckpt-train writes too: state/<position or parameter name>/<slot>
# (flatten_dict, sep "/"; ckpt_tools.format.lerobot says which LeRobot writes which,
# ckpt_tools.format.param_groups how ckpt-train maps positions to names).
LEROBOT_OPTIMIZER_SEP = "/"
LEROBOT_OPTIMIZER_PREFIX = "state" + LEROBOT_OPTIMIZER_SEP
RNG_STATE = "rng_state.safetensors"
SCHEDULER_STATE = "scheduler_state.json"
SCALER_STATE = "scaler_state.json"
TRAINING_STEP = "training_step.json"
EMA_STATE = "ema_state.pt"  # LeRobot main's EMA_STATE_FILENAME: diffusers' EMAModel.state_dict(), torch.save
SAVE_FILES = "save_files.json"  # the files one save wrote (ckpt_tools.format.rules.save_files)

# Inside a DCP directory
DCP_METADATA = ".metadata"
DCP_SHARD_SUFFIX = ".distcp"
# Beside .metadata, written by the training core at every save: the chunk table in columns,
# bound to the .metadata it describes (ckpt_tools.dcp.index_file). Tools read it instead of
# the pickle; torch and other readers ignore it.
DCP_INDEX = ".metadata.index"
# What other trainers save next to the model in one DCP state dict - never weights: torchtitan's
# CheckpointManager (its MODEL entries flattened to the top level beside OPTIMIZER, LR_SCHEDULER,
# DATALOADER and TRAIN_STATE) and PyTorch's DCP recipe ({"app": {"model": ..., "optim": ...}}).
NON_MODEL_DCP_KEYS = ("optimizer", "optim", "lr_scheduler", "dataloader", "train_state")

# Roots of other trainers: torchtitan's checkpoint folder (its ``checkpoint.folder``, by default
# ``checkpoint/`` in the dump folder) holds one save per step, ``step-<N>/``: a DCP directory, or
# the Hugging Face safetensors of a ``last_save_in_hf`` last step (model.safetensors.index.json).
TRAINER_CHECKPOINT_DIR = "checkpoint"
_TRAINER_STEP_RE = re.compile(r"^step-(\d+)$")
# dcp.save(..., use_collectives=False): each rank writes __<rank>.metadata, and no .metadata.
DCP_RANK_METADATA_RE = re.compile(r"^__(\d+)\.metadata$")
SAFETENSORS_SUFFIX = ".safetensors"
SAFETENSORS_INDEX_SUFFIX = ".safetensors.index.json"

# A save in progress lives in a hidden sibling of its final name until it is complete.
PARTIAL_PREFIX = "."
PARTIAL_SUFFIX = ".partial"
# ``last`` as a regular file holding a step directory's name (where no symlink can be made).
LAST_POINTER_MAX_BYTES = 64

_STEP_DIR_RE = re.compile(r"^\d{6,}$")


class CheckpointFormat(str, enum.Enum):
    """What ``pretrained_model/`` holds for the weights of a sharded run."""

    SAFETENSORS = "safetensors"
    DCP = "dcp"
    SAFETENSORS_DCP = "safetensors_dcp"

    @property
    def has_gathered(self) -> bool:
        return self in (CheckpointFormat.SAFETENSORS, CheckpointFormat.SAFETENSORS_DCP)

    @property
    def has_dcp(self) -> bool:
        return self in (CheckpointFormat.DCP, CheckpointFormat.SAFETENSORS_DCP)


def step_dir_name(step: int, total_steps: int = 0) -> str:
    """Zero-padded step directory name: at least six digits, wider for longer runs."""
    width = max(6, len(str(total_steps)))
    return f"{step:0{width}d}"


def partial_dir_name(final_name: str) -> str:
    """Name of the hidden directory a save writes into before it is renamed into place."""
    return f"{PARTIAL_PREFIX}{final_name}{PARTIAL_SUFFIX}"


def is_step_dir_name(name: str) -> bool:
    return bool(_STEP_DIR_RE.match(name))


def is_lerobot_optimizer_key(key: str) -> bool:
    """A key in LeRobot's flat optimizer format, ``state/<position or name>/<slot>``."""
    return key.startswith(LEROBOT_OPTIMIZER_PREFIX) and key.count(LEROBOT_OPTIMIZER_SEP) == 2


def split_flat_optimizer_key(key: str) -> tuple[str, str]:
    """``state.<param>.<slot>`` → (param, slot): the slot is the last dotted part (parameter names hold dots).

    LeRobot's ``state/<position or name>/<slot>`` splits at its slashes (names never hold one):
    (``"12"``, slot) for state keyed by position. A key without either prefix splits at its last
    dot; its parameter then matches none the param groups list, which is how the loader (and
    ``verify-resume``) tell it apart.
    """
    if is_lerobot_optimizer_key(key):
        _, owner, slot = key.split(LEROBOT_OPTIMIZER_SEP)
        return owner, slot
    param, _, slot = key.removeprefix(FLAT_OPTIMIZER_PREFIX).rpartition(".")
    return param, slot


@dataclass(frozen=True)
class StepPaths:
    """Every path inside one checkpoint step directory."""

    root: Path

    @property
    def step(self) -> int | None:
        return int(self.root.name) if is_step_dir_name(self.root.name) else None

    @property
    def run_dir(self) -> Path | None:
        """The run this step belongs to: the directory holding its ``checkpoints/`` (None: not in one)."""
        return self.root.parent.parent if self.root.parent.name == CHECKPOINTS_DIR else None

    @property
    def pretrained_model(self) -> Path:
        return self.root / PRETRAINED_MODEL_DIR

    @property
    def training_state(self) -> Path:
        return self.root / TRAINING_STATE_DIR

    @property
    def pretrained_model_ema(self) -> Path:
        return self.root / PRETRAINED_MODEL_EMA_DIR

    @property
    def ema_model_weights(self) -> Path:
        return self.pretrained_model_ema / MODEL_WEIGHTS

    @property
    def ema_model_dcp(self) -> Path:
        """The EMA shadow's DCP shards (sharded like the parameters), laid out as the model's."""
        return self.pretrained_model_ema / MODEL_DCP_DIR

    @property
    def ema_state(self) -> Path:
        return self.training_state / EMA_STATE

    @property
    def policy_config(self) -> Path:
        return self.pretrained_model / POLICY_CONFIG

    @property
    def train_config(self) -> Path:
        return self.pretrained_model / TRAIN_CONFIG

    @property
    def model_weights(self) -> Path:
        return self.pretrained_model / MODEL_WEIGHTS

    @property
    def adapter_weights(self) -> Path:
        return self.pretrained_model / ADAPTER_WEIGHTS

    @property
    def adapter_config(self) -> Path:
        return self.pretrained_model / ADAPTER_CONFIG

    @property
    def model_dcp(self) -> Path:
        return self.pretrained_model / MODEL_DCP_DIR

    @property
    def optimizer_dcp(self) -> Path:
        return self.training_state / OPTIMIZER_DCP_DIR

    @property
    def optimizer_param_groups(self) -> Path:
        return self.training_state / OPTIMIZER_PARAM_GROUPS

    @property
    def optimizer_state(self) -> Path:
        return self.training_state / OPTIMIZER_STATE

    @property
    def rng_state(self) -> Path:
        return self.training_state / RNG_STATE

    @property
    def save_files(self) -> Path:
        return self.training_state / SAVE_FILES

    @property
    def scheduler_state(self) -> Path:
        return self.training_state / SCHEDULER_STATE

    @property
    def scaler_state(self) -> Path:
        return self.training_state / SCALER_STATE

    @property
    def training_step(self) -> Path:
        return self.training_state / TRAINING_STEP

    def processor_files(self) -> list[Path]:
        """The ``policy_{pre,post}processor*`` files present in ``pretrained_model/``."""
        if not self.pretrained_model.is_dir():
            return []
        return sorted(p for p in self.pretrained_model.iterdir() if p.name.startswith((PREPROCESSOR, POSTPROCESSOR)))


class PathKind(str, enum.Enum):
    CHECKPOINTS_ROOT = "checkpoints_root"
    STEP_DIR = "step_dir"
    PRETRAINED_MODEL = "pretrained_model"
    TRAINING_STATE = "training_state"
    DCP_DIR = "dcp_dir"
    SAFETENSORS_FILE = "safetensors_file"
    TRAINER_ROOT = "trainer_root"  # another trainer's folder of step-<N>/ saves (torchtitan's checkpoint/)
    SAFETENSORS_DIR = "safetensors_dir"  # a folder of *.safetensors (+ index): convert-dcp's, torch's HF storage


@dataclass(frozen=True)
class Located:
    """What a user-supplied path turned out to be, and the step directory it belongs to."""

    path: Path
    kind: PathKind
    step: StepPaths | None = None  # the step dir the path is in, when there is one
    checkpoints_root: Path | None = None


def list_step_dirs(checkpoints_root: Path) -> list[Path]:
    """Complete step directories under a checkpoints root, oldest first (partials skipped)."""
    if not checkpoints_root.is_dir():
        return []
    steps = [p for p in checkpoints_root.iterdir() if p.is_dir() and is_step_dir_name(p.name)]
    return sorted(steps, key=lambda p: int(p.name))


def list_partial_dirs(checkpoints_root: Path) -> list[Path]:
    """Saves that never completed (left by a crash); never read as checkpoints."""
    if not checkpoints_root.is_dir():
        return []
    return sorted(
        p for p in checkpoints_root.iterdir() if p.name.startswith(PARTIAL_PREFIX) and p.name.endswith(PARTIAL_SUFFIX)
    )


def read_last_pointer(pointer: Path) -> str:
    """The step directory name a ``last`` pointer file holds; :class:`CheckpointError` for anything else.

    Where a file system cannot hold a symlink (Windows shares, some network and object-store
    mounts), ``last`` is a small regular file holding the name of the step directory beside it.
    That file is anyone's to write, so only a plain step directory name of this checkpoints root
    is taken: no separator, no ``..``, no absolute path, at most :data:`LAST_POINTER_MAX_BYTES`.
    """
    try:
        remote = remote_file(pointer)
        if remote is not None:  # on the Hub: one ranged read of at most the limit
            data = remote.remote_read(0, min(remote.remote_size(), LAST_POINTER_MAX_BYTES + 1))
        else:
            with open(pointer, "rb") as handle:
                data = handle.read(LAST_POINTER_MAX_BYTES + 1)
    except OSError as e:
        raise CheckpointError(f"{pointer}: cannot read the 'last' pointer file ({e.strerror or e})") from None
    if len(data) > LAST_POINTER_MAX_BYTES:
        raise CheckpointError(
            f"{pointer}: not a 'last' pointer (over {LAST_POINTER_MAX_BYTES} bytes; it holds a step directory's name)"
        )
    name = data.decode("utf-8", errors="replace").strip()
    if not is_step_dir_name(name):
        raise CheckpointError(
            f"{pointer}: not a 'last' pointer ({name!r} is not the name of a step directory beside it)"
        )
    return name


def resolve_last(checkpoints_root: Path) -> Path | None:
    """The step directory ``last`` points at, or None when there is no usable ``last``.

    ``last`` is a symlink, or a pointer file (:func:`read_last_pointer`, which refuses a hostile
    one with :class:`CheckpointError`); every reader of ``last``, trainer and tools, asks here.
    On the Hub (a :class:`~ckpt_tools.io.remote.RemoteFile` root) there are no symlinks: ``last``
    is a pointer file where the upload has one (``push --whole-run`` writes it), else the newest
    step directory (an upload of a run leaves a symlink out; a commit is all or nothing).
    """
    if remote_file(checkpoints_root) is not None:
        pointer = checkpoints_root / LAST_LINK
        if pointer.is_file():
            target = checkpoints_root / read_last_pointer(pointer)
            return target if target.is_dir() else None
        steps = list_step_dirs(checkpoints_root)
        return steps[-1] if steps else None
    link = checkpoints_root / LAST_LINK
    if link.is_file() and not link.is_symlink():
        target = checkpoints_root / read_last_pointer(link)
        return target if target.is_dir() and not target.is_symlink() else None
    if not link.is_symlink() and not link.is_dir():
        return None
    try:
        target = link.resolve()
    except (OSError, RuntimeError):  # a symlink loop ('last -> last'): no usable last
        return None
    return target if target.is_dir() else None


def last_is_pointer_file(checkpoints_root: Path) -> bool:
    """Whether ``last`` is a pointer file rather than a symlink (how ``inspect`` describes it)."""
    link = checkpoints_root / LAST_LINK
    return link.is_file() and not link.is_symlink()


def trainer_step_number(path: Path) -> int | None:
    """N of torchtitan's ``step-<N>`` save directory name (None: not one)."""
    m = _TRAINER_STEP_RE.match(path.name)
    return int(m.group(1)) if m else None


def _is_complete_trainer_save(path: Path) -> bool:
    return (path / DCP_METADATA).is_file() or (path / MODEL_WEIGHTS_INDEX).is_file()


def _trainer_step_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    steps = [p for p in root.iterdir() if p.is_dir() and trainer_step_number(p) is not None]
    return sorted(steps, key=lambda p: trainer_step_number(p) or 0)


def list_trainer_steps(root: Path) -> list[Path]:
    """The complete ``step-<N>/`` saves under another trainer's root, oldest first.

    Complete as torchtitan itself counts them when it resumes (``_find_load_step``): the DCP
    ``.metadata`` (written last) or the safetensors index of a Hugging Face last step is there.
    """
    return [p for p in _trainer_step_dirs(root) if _is_complete_trainer_save(p)]


def incomplete_trainer_steps(root: Path) -> list[Path]:
    """``step-<N>/`` directories of a save that never completed (no ``.metadata``); never read."""
    return [p for p in _trainer_step_dirs(root) if not _is_complete_trainer_save(p)]


def newest_trainer_step(root: Path) -> Path:
    """The save a resume of that trainer reads, and what the tools take for its root: the highest N."""
    steps = list_trainer_steps(root)
    if not steps:
        raise CheckpointError(f"{root}: no complete step-N save (none holds a .metadata)")
    return steps[-1]


def _looks_like_step_dir(path: Path) -> bool:
    return (path / PRETRAINED_MODEL_DIR).is_dir() or (path / TRAINING_STATE_DIR).is_dir()


def locate(path: str | os.PathLike[str]) -> Located:
    """Say what ``path`` is within the layout; raise :class:`CheckpointError` if nothing known.

    ``path`` may be a :class:`~ckpt_tools.hub.hubpath.HubPath`: the same rules then run on the
    repository's listing.
    """
    p = as_path(path)
    if not p.exists():
        raise CheckpointError(missing_path_message(p))
    if p.is_file():
        if p.name == LAST_LINK and not p.is_symlink():  # a pointer file standing for the step it names
            target = resolve_last(p.parent)
            if target is None:
                raise CheckpointError(f"{p}: points at {read_last_pointer(p)}, which is no step directory here")
            return locate(target)
        if p.name.endswith(".safetensors"):
            step = _enclosing_step(p.parent)
            return Located(p, PathKind.SAFETENSORS_FILE, step)
        if p.name == TRAIN_CONFIG or p.name == POLICY_CONFIG:
            return locate(p.parent)
        if p.name == DCP_METADATA or DCP_RANK_METADATA_RE.match(p.name) or p.name.endswith(SAFETENSORS_INDEX_SUFFIX):
            return locate(p.parent)
        raise CheckpointError(f"{p}: not a checkpoint file (expected a .safetensors file or a directory)")
    if (p / DCP_METADATA).exists() or any(p.glob(f"*{DCP_SHARD_SUFFIX}")):
        return Located(p, PathKind.DCP_DIR, _enclosing_step(p.parent.parent))
    if p.name == PRETRAINED_MODEL_DIR or ((p / POLICY_CONFIG).exists() and not _looks_like_step_dir(p)):
        return Located(p, PathKind.PRETRAINED_MODEL, _enclosing_step(p.parent))
    if p.name == TRAINING_STATE_DIR or (p / TRAINING_STEP).exists():
        return Located(p, PathKind.TRAINING_STATE, _enclosing_step(p.parent))
    if _looks_like_step_dir(p):
        return Located(p, PathKind.STEP_DIR, StepPaths(p), p.parent)
    if (p / LAST_LINK).exists() or list_step_dirs(p) or list_partial_dirs(p):
        return Located(p, PathKind.CHECKPOINTS_ROOT, None, p)
    if _trainer_step_dirs(p):
        return Located(p, PathKind.TRAINER_ROOT, None, p)
    if (p / CHECKPOINTS_DIR).is_dir():
        return locate(p / CHECKPOINTS_DIR)
    if _trainer_step_dirs(p / TRAINER_CHECKPOINT_DIR):  # torchtitan's dump folder
        return locate(p / TRAINER_CHECKPOINT_DIR)
    if any(p.glob(f"*{SAFETENSORS_SUFFIX}")) or any(p.glob(f"*{SAFETENSORS_INDEX_SUFFIX}")):
        return Located(p, PathKind.SAFETENSORS_DIR, _enclosing_step(p.parent))
    raise CheckpointError(
        f"{p}: not a checkpoint (no pretrained_model/, training_state/, .metadata, *.safetensors, checkpoints/"
        " or step-N/ found)"
    )


def is_hub_id(path: str) -> bool:
    """``user/name``: how the Hub names a model (a path starting with ``/``, ``.`` or ``~`` is a local one)."""
    return path.count("/") == 1 and not path.startswith(("/", ".", "~"))


STEPS_NAMED = 5  # newest step names a "no such" message lists (a run may hold thousands)


def missing_path_message(path: Path) -> str:
    """One line for a path that does not exist, naming the steps that do where it is in a run.

    A mistyped step number is the common case: ``.../checkpoints/000099`` says which steps the
    checkpoints root holds and where ``last`` points, instead of a bare "no such file".
    """
    for ancestor in list(path.parents)[:3]:
        root = ancestor / CHECKPOINTS_DIR if (ancestor / CHECKPOINTS_DIR).is_dir() else ancestor
        steps = list_step_dirs(root) if root.is_dir() else []
        under_root = path.relative_to(root).parts[:1] if path.is_relative_to(root) else ()
        if steps and under_root and not (root / under_root[0]).exists():
            newest = [step.name for step in steps[-STEPS_NAMED:]]
            shown = ", ".join(newest) if len(steps) <= STEPS_NAMED else f"..., {', '.join(newest)}"
            last = resolve_last(root)
            where = f"; {LAST_LINK} is {last.name}" if last is not None else ""
            return f"{path}: no such step; {root} holds {len(steps)} step(s): {shown}{where}"
    return f"{path}: no such file or directory"


def resolve_step(path: str | os.PathLike[str]) -> StepPaths:
    """The step directory a user means by ``path``: what every tool and the trainer's resume read.

    Accepted: a run's output dir (the one holding ``checkpoints/``), a checkpoints root (its
    ``last``), a step dir or ``last`` itself, and anything inside a step dir -
    ``pretrained_model/``, ``training_state/``, a DCP dir, ``train_config.json``, a weights
    file. ``last`` is followed to the step it points at, so a later save that moves ``last``
    does not change what was resolved. Raises :class:`CheckpointError` with one line.
    """
    located = locate(path)
    if located.kind is PathKind.TRAINER_ROOT:
        raise CheckpointError(
            f"{path}: a folder of step-N saves (torchtitan's), not a LeRobot checkpoint step; its newest save is"
            f" {newest_trainer_step(located.path).name}/"
        )
    if located.kind is PathKind.CHECKPOINTS_ROOT:
        assert located.checkpoints_root is not None
        last = resolve_last(located.checkpoints_root)
        if last is None:
            raise CheckpointError(f"{path}: no complete checkpoint ('last' is missing or dangling)")
        return StepPaths(last)
    step = located.step
    if step is None and located.path.is_file():
        return resolve_step(located.path.parent)  # a file inside pretrained_model/ or training_state/
    if step is None:
        raise CheckpointError(f"{path}: not inside a checkpoint step directory (no training_state/ next to it)")
    return StepPaths(step.root.resolve()) if step.root.is_symlink() else step


def pretrained_model_dir(path: str | os.PathLike[str]) -> Path:
    """The saved policy a path names: what ``--policy.path`` loads and ``push`` publishes.

    A path naming a whole step - a step dir, ``last``, a checkpoints root, a run dir - means
    that step's ``pretrained_model/`` (:func:`resolve_step`); any other path (a
    ``pretrained_model/``, a ``convert-dcp --output`` dir, something missing) is itself.
    """
    p = as_path(path).expanduser()
    try:
        kind = locate(p).kind
    except CheckpointError:
        return p
    return resolve_step(p).pretrained_model if kind in (PathKind.CHECKPOINTS_ROOT, PathKind.STEP_DIR) else p


def _enclosing_step(candidate: Path) -> StepPaths | None:
    return StepPaths(candidate) if _looks_like_step_dir(candidate) else None
