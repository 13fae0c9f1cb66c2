"""What a weights push (the default) uploads from a local folder, decided before any network traffic.

(``--whole-step`` / ``--whole-run`` publish whole checkpoints instead: :mod:`ckpt_tools.hub.whole_step`.)
A model repo gets the top-level ``*.safetensors``, ``*.json`` and ``*.md`` files of a
converted ``pretrained_model/`` (or of a convert output directory) and nothing else: never
the DCP shard directories, never ``training_state/``, never hidden files (a save or a
conversion in progress writes into hidden temporaries). What is published is decided by what
the folder holds, not by its name: it must hold a pretrained model - ``config.json`` with
``model.safetensors`` (or a sharded ``model.safetensors.index.json`` and its shards), or a PEFT
``adapter_model.safetensors`` with its ``adapter_config.json`` - so a ``training_state/`` (RNG,
scheduler, optimizer state) reached as ``.`` is refused like any other folder without a model.
Everything that would make the published repo unusable - no model, weights only as DCP
shards, a truncated safetensors file, a sharded index naming a missing shard, a JSON file that
does not parse - is refused here with one line, so a push never starts that cannot end well.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ckpt_tools.errors import CheckpointError, UsageError
from ckpt_tools.format import layout, manifest
from ckpt_tools.format.ema import no_ema_weights
from ckpt_tools.io.safe_read import read_json_file
from ckpt_tools.st.header import MAX_HEADER_BYTES, read_header
from ckpt_tools.st.index import read_index

PUBLISHED_SUFFIXES = (".safetensors", ".json", ".md")
README = "README.md"
# What a push publishes: the weights alone (default), one whole step, or every step and ``last``.
WEIGHTS, WHOLE_STEP, WHOLE_RUN = "weights", "whole-step", "whole-run"


@dataclass(frozen=True)
class PublishFile:
    """One local file and its path in the repo (a top-level name, or ``checkpoints/<step>/...``)."""

    name: str
    path: Path
    size: int
    # For *.safetensors files: dtypes present and the number of scalar values (parameters).
    dtypes: tuple[str, ...] = ()
    num_values: int | None = None
    model_file: bool = True  # a top-level file of the pretrained model (not training state, not a shard)
    data: bytes | None = None  # published instead of the file's bytes: a rewritten copy, or ``last``
    rewritten: tuple[str, ...] = ()  # the fields the copy set to null (ckpt_tools.hub.local_paths)

    @property
    def is_weights(self) -> bool:
        """Model or adapter weights (processor statistics are safetensors files too, but not weights)."""
        return self.model_file and self.name.endswith(".safetensors") and not manifest.PROCESSORS.holds(self.path.name)

    @property
    def source(self) -> str:
        """Where the published bytes come from, for the dry run."""
        if self.data is None:
            return str(self.path)
        if self.rewritten:
            return f"{self.path} ({self.rewrite})"
        return "generated"

    @property
    def rewrite(self) -> str:
        """What the published copy changed (JSON: paths set to null; DCP metadata: its checkpoint_id)."""
        fields = ", ".join(self.rewritten)
        if self.name.endswith(".json"):
            return f"copy: local paths set to null in {fields}"
        return f"copy: {fields} made the directory's place in the repo"

    def read_published(self) -> bytes:
        """The bytes that are published (small files only: JSON, Markdown)."""
        return self.data if self.data is not None else self.path.read_bytes()


@dataclass(frozen=True)
class PublishPlan:
    """The files of ``folder`` a push uploads, and what it leaves out (named, for the report)."""

    folder: Path  # the pretrained model the card describes
    files: tuple[PublishFile, ...]
    skipped: tuple[str, ...]
    training_step_path: Path | None
    scope: str = WEIGHTS  # WEIGHTS, WHOLE_STEP or WHOLE_RUN

    @property
    def rewritten(self) -> tuple[PublishFile, ...]:
        """Files published as copies with local paths set to null."""
        return tuple(f for f in self.files if f.rewritten)

    @property
    def has_readme(self) -> bool:
        return any(f.name == README for f in self.files)

    @property
    def weights(self) -> tuple[PublishFile, ...]:
        """The weights of the model the card describes (of a whole run: the step ``last`` names)."""
        return tuple(f for f in self.files if f.is_weights and f.path.parent == self.folder)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def refuse_secrets(self, secrets: tuple[str, ...]) -> None:
        """Refuse to publish a text file (or safetensors header) that contains a Hub token.

        The JSON and Markdown files are small and read whole; of a safetensors file only the
        header (where ``__metadata__`` strings live) is read.
        """
        secrets = tuple(s for s in secrets if s)
        if not secrets:
            return
        for f in self.files:
            if f.name.endswith(".distcp"):
                continue  # tensor data only, as the trainer wrote it
            with _readable(f.path):
                data = _safetensors_header_bytes(f.path) if f.name.endswith(".safetensors") else f.read_published()
            if any(s.encode() in data for s in secrets):
                raise CheckpointError(
                    f"{f.path}: contains your Hugging Face token; refusing to publish it (remove it from the file)"
                )


def resolve_publish_folder(path: str | os.PathLike[str]) -> Path:
    """Turn what a user typed into the folder to publish.

    A path that names a whole step - a step dir, ``last``, a checkpoints root, the run dir
    holding ``checkpoints/`` - publishes that step's ``pretrained_model/``
    (:func:`~ckpt_tools.format.layout.pretrained_model_dir`, the folder ``--policy.path`` loads).
    Any other directory - a ``pretrained_model/``, a ``convert-dcp --output`` dir - is published as it is,
    if it holds a model (:func:`plan_publish` decides that from its files).
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such directory")
    if not p.is_dir():
        raise UsageError(f"{p}: PATH must be a directory (a pretrained_model/ dir, a step dir or a convert output dir)")
    return layout.pretrained_model_dir(p)


def ema_publish_folder(path: str | os.PathLike[str]) -> Path:
    """``push --ema``: the ``pretrained_model_ema/`` of the step ``path`` names - the EMA weights as a policy."""
    p = Path(path)
    if p.name == layout.PRETRAINED_MODEL_EMA_DIR:
        return p
    try:
        step = layout.resolve_step(p)
    except CheckpointError:
        raise UsageError(
            f"{p}: --ema publishes a step's {layout.PRETRAINED_MODEL_EMA_DIR}/: give a step dir or a checkpoints root"
        ) from None
    if not step.pretrained_model_ema.is_dir():
        raise CheckpointError(no_ema_weights(step))
    return step.pretrained_model_ema


def plan_publish(folder: str | os.PathLike[str]) -> PublishPlan:
    """Select and check the files of ``folder`` to upload; raise one clear line if it cannot be published."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such directory")
    real_folder = folder.resolve()
    files: list[PublishFile] = []
    skipped: list[str] = []
    dcp_dirs: list[str] = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        name = entry.name
        if entry.is_dir():
            skipped.append(name + "/")
            if (entry / layout.DCP_METADATA).exists() or any(entry.glob(f"*{layout.DCP_SHARD_SUFFIX}")):
                dcp_dirs.append(name + "/")
            continue
        if name.startswith(".") or not name.endswith(PUBLISHED_SUFFIXES) or not entry.is_file():
            skipped.append(name)
            continue
        if entry.is_symlink() and entry.resolve().parent != real_folder:
            raise CheckpointError(f"{entry}: is a link to a file outside {folder}; refusing to publish it")
        files.append(checked_file(entry))
    plan = PublishPlan(folder, tuple(files), tuple(skipped), _training_step_path(folder))
    _check_index(plan)
    _require_model(plan, dcp_dirs)
    return plan


def _require_model(plan: PublishPlan, dcp_dirs: list[str]) -> None:
    """The folder must hold a pretrained model a loader can build: its config and its weights.

    Decided by the files, not by the folder's name, so a checkpoint's ``training_state/`` (even
    reached as ``.``, even without its ``training_step.json``) never publishes its RNG,
    scheduler or optimizer state as a "model".
    """
    folder, names = plan.folder, {f.name for f in plan.files}
    full = layout.MODEL_WEIGHTS in names or layout.MODEL_WEIGHTS_INDEX in names
    adapter = layout.ADAPTER_WEIGHTS in names
    state = _training_state_files(folder)
    if state and not (full or adapter):
        raise UsageError(
            f"{folder}: holds training state ({', '.join(state)}), not a model; it is never published -"
            " pass the step dir or its pretrained_model/"
        )
    if not (full or adapter):
        if dcp_dirs:
            raise CheckpointError(
                f"{folder}: holds the weights only as DCP shards ({', '.join(dcp_dirs)}); get model.safetensors"
                f" with `ckpt-tools convert-dcp --checkpoint-dir {folder}` and push again, or convert and publish"
                f" in one go with `ckpt-tools convert-dcp --checkpoint-dir {folder} --push-to-hub REPO`"
                " (or push everything with --whole-step)"
            )
        raise CheckpointError(
            f"{folder}: nothing to publish (no pretrained model: no {layout.MODEL_WEIGHTS},"
            f" {layout.MODEL_WEIGHTS_INDEX} or {layout.ADAPTER_WEIGHTS} at its top level)"
        )
    if full and layout.POLICY_CONFIG not in names:
        raise CheckpointError(
            f"{folder}: holds model weights but no {layout.POLICY_CONFIG}, so no loader can build the policy;"
            f" copy the checkpoint's pretrained_model/{layout.POLICY_CONFIG} next to them, then publish"
        )
    if adapter and not full and layout.ADAPTER_CONFIG not in names:
        raise CheckpointError(
            f"{folder}: holds {layout.ADAPTER_WEIGHTS} but no {layout.ADAPTER_CONFIG}, so peft cannot load it;"
            " copy the checkpoint's one next to it, then publish"
        )


def _training_state_files(folder: Path) -> list[str]:
    """The names of a checkpoint's training-state parts (manifest) present in ``folder``."""
    prefix = f"{manifest.TS}/"
    names = {f.removeprefix(prefix) for part in manifest.PARTS for f in part.files if f.startswith(prefix)}
    return sorted(n for n in names if (folder / n).exists())


@contextlib.contextmanager
def _readable(path: Path) -> Iterator[None]:
    """A file that cannot be read is bad input: one line, not a traceback."""
    try:
        yield
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable ({e.strerror or e})") from None


def _training_step_path(folder: Path) -> Path | None:
    """``../training_state/training_step.json`` of a ``pretrained_model/`` inside a step dir."""
    candidate = folder.parent / layout.TRAINING_STATE_DIR / layout.TRAINING_STEP
    return candidate if folder.name == layout.PRETRAINED_MODEL_DIR and candidate.is_file() else None


def checked_file(path: Path, name: str | None = None, model_file: bool = True) -> PublishFile:
    """``path`` published as ``name`` (default: its own name), once it is known to be readable whole.

    A JSON file must parse, a safetensors file must hold exactly what its header promises:
    a file the Hub would serve but no loader could read is refused here, with one line.
    """
    name = path.name if name is None else name
    with _readable(path):
        size = path.stat().st_size
        if path.name.endswith(".json"):
            read_json_file(path)
            return PublishFile(name, path, size, model_file=model_file)
        if path.name.endswith(".safetensors"):
            dtypes, num_values = _safetensors_summary(path)
            return PublishFile(name, path, size, dtypes, num_values, model_file=model_file)
        return PublishFile(name, path, size, model_file=model_file)


def _safetensors_header_bytes(path: Path) -> bytes:
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            return b""
        (n,) = struct.unpack("<Q", prefix)
        return f.read(min(n, MAX_HEADER_BYTES))


def _safetensors_summary(path: Path) -> tuple[tuple[str, ...], int]:
    """The dtypes and element count of a safetensors file whose header promises exactly its bytes."""
    header = read_header(path)
    if header.problems:
        raise CheckpointError(f"{path}: not a complete safetensors file ({header.problems[0]}); refusing to publish it")
    entries = header.entries.values()
    return tuple(sorted({e.dtype for e in entries})), sum(e.numel for e in entries)


def _check_index(plan: PublishPlan) -> None:
    """A sharded ``*.safetensors.index.json`` must name only shards that are being published."""
    names = {f.name for f in plan.files}
    for f in plan.files:
        if not f.name.endswith(".safetensors.index.json"):
            continue
        weight_map = read_index(f.path)
        missing = sorted({str(v) for v in weight_map.values()} - names)
        if missing:
            raise CheckpointError(
                f"{f.path}: names shard(s) not in {plan.folder}: {', '.join(missing)} (incomplete conversion?)"
            )
