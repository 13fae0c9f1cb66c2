"""``convert_dcp``: merge DCP shards into safetensors, streaming, atomically, without torch.

The flow is plan → write → (verify) → commit → (delete):

1. *plan*: find the DCP directory, load its chunk index and refuse anything unsafe or
   inconsistent; read every chunk's archive header (a few hundred bytes each) so byte counts,
   dtypes and shapes are checked before a single output byte is written; name the outputs
   (``model.safetensors``, ``adapter_model.safetensors`` for PEFT, Hub-style shards with
   ``--max-shard-size``, or a flat optimizer file).
2. *write*: one temporary sibling per output file, tensor after tensor (see
   :mod:`ckpt_tools.dcp.assemble` and :mod:`ckpt_tools.st.writer`), each fsynced.
3. *verify* (with ``delete_dcp``): re-read every written byte and compare it with the chunks.
4. *commit*: rename the temporaries into place, the index file last.
5. *delete* (with ``delete_dcp``): only now, and only when what remains still resumes
   bit-exactly (:mod:`ckpt_tools.convert_delete`), remove the DCP directory - renamed aside
   atomically first, so an interruption leaves the old state or the new one.

Any failure before the commit removes the temporaries: no partial output, inputs untouched.
A rerun after a kill picks up where it stopped: it removes its own abandoned temporaries,
keeps outputs that already hold exactly the planned bytes, and finishes an interrupted deletion.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ckpt_tools import convert_delete
from ckpt_tools.convert_delete import Deletion
from ckpt_tools.dcp import casting, hf_storage, selection, validate
from ckpt_tools.dcp.archives import ArchiveChecker
from ckpt_tools.dcp.assemble import Copy, tensor_pieces
from ckpt_tools.dcp.files import ShardFiles, pread_exact
from ckpt_tools.dcp.index import ChunkIndex, TensorEntry
from ckpt_tools.dcp.reader import ChunkLayout, read_pickled_object
from ckpt_tools.dcp.safe_pickle import plain_data
from ckpt_tools.errors import CheckpointError, CkptError, UsageError, WriteError
from ckpt_tools.format import layout as L
from ckpt_tools.format import manifest, peft_keys
from ckpt_tools.format.ema import no_ema_weights
from ckpt_tools.format.rules import save_files
from ckpt_tools.io.dir_lock import DirLock, DirLocked
from ckpt_tools.io.fsutil import Leftover, TempSibling, fsync_dir
from ckpt_tools.io.remote import as_path
from ckpt_tools.st import dtypes
from ckpt_tools.st.dtypes import DType
from ckpt_tools.st.header import read_header
from ckpt_tools.st.writer import COPY_BLOCK, StreamingWriter, TensorToWrite, parse_size, plan_shards
from ckpt_tools.units import human_bytes

WHAT_CHOICES = ("model", "optimizer")
OPTIMIZER_OUTPUT_STEM = "optimizer_state_flat"


@dataclass(frozen=True)
class PlannedTensor:
    name: str  # the output key
    source: TensorEntry
    src_dtype: DType
    dtype: DType

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.shape

    @property
    def nbytes(self) -> int:
        return self.source.numel * self.dtype.itemsize

    def to_write(self) -> TensorToWrite:
        shape = self.dtype.safetensors_shape(self.shape)
        assert self.dtype.safetensors is not None and shape is not None  # unrepresentable ones are never planned
        return TensorToWrite(self.name, self.dtype.safetensors, shape, self.nbytes)


@dataclass(frozen=True)
class PlannedFile:
    name: str
    tensors: tuple[PlannedTensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


@dataclass(frozen=True)
class ConvertPlan:
    """Everything a conversion will do, computed before anything is written (``--dry-run`` prints it)."""

    dcp_dir: Path
    output_dir: Path
    what: str
    peft: bool
    dtype: str | None  # None: every tensor keeps its saved dtype
    files: tuple[PlannedFile, ...]
    index_name: str | None
    index: dict[str, Any] | None
    metadata: dict[str, str]
    notes: tuple[str, ...] = ()
    selected: str | None = None  # the dotted key path converted ("": the top level), see ckpt_tools.dcp.selection
    left_out: tuple[str, ...] = ()  # training state under it that was not converted
    skipped: tuple[str, ...] = ()  # tensors of a dtype safetensors cannot hold: not in the output

    @property
    def tensor_count(self) -> int:
        return sum(len(f.tensors) for f in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.nbytes for f in self.files)

    @property
    def output_paths(self) -> list[Path]:
        paths = [self.output_dir / f.name for f in self.files]
        if self.index_name:
            paths.append(self.output_dir / self.index_name)
        return paths

    def to_dict(self) -> dict[str, Any]:
        return {
            "dcp_dir": str(self.dcp_dir),
            "output_dir": str(self.output_dir),
            "what": self.what,
            "selected": self.selected,
            "left_out": list(self.left_out),
            "peft": self.peft,
            "dtype": self.dtype or "as saved",
            "tensor_count": self.tensor_count,
            "total_bytes": self.total_bytes,
            "files": [{"name": f.name, "bytes": f.nbytes, "tensors": len(f.tensors)} for f in self.files]
            + ([{"name": self.index_name, "bytes": None, "tensors": 0}] if self.index_name else []),
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class ConvertResult:
    plan: ConvertPlan
    output_files: tuple[Path, ...]
    tensor_count: int
    bytes: int
    dry_run: bool
    verified: bool = False
    deleted_dcp: bool = False
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    deletion: Deletion | None = field(default=None, repr=False, compare=False)  # what deleting the shards needs
    # which files were verified (device, inode, size, mtime): the deletion refuses replaced ones
    identities: tuple[tuple[int, ...], ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "output_files": [str(p) for p in self.output_files],
            "tensor_count": self.tensor_count,
            "bytes": self.bytes,
            "dry_run": self.dry_run,
            "verified": self.verified,
            "deleted_dcp": self.deleted_dcp,
            "seconds": round(self.seconds, 3),
            "plan": self.plan.to_dict(),
            "notes": list(self.notes),
        }


# ====================================================================== the API


def convert_dcp(
    checkpoint_dir: str | os.PathLike[str],
    *,
    output: str | os.PathLike[str] | None = None,
    dtype: str | None = None,
    max_shard_size: str | int | None = None,
    dry_run: bool = False,
    delete_dcp: bool = False,
    allow_unresumable: bool = False,
    what: str | None = None,
    key: str | None = None,
    overwrite: bool = False,
    verify: bool = False,
    progress: bool = True,
    ema: bool = False,
) -> ConvertResult:
    """Merge a DCP checkpoint into safetensors.

    ``checkpoint_dir``: a step dir, its ``pretrained_model/`` (or ``training_state/`` for the
    optimizer), a DCP dir itself, a checkpoints root (its ``last`` step), or another trainer's
    root of ``step-N/`` saves (its newest). ``output``: a
    directory, or a ``.safetensors`` file path when unsharded; by default next to the shards in
    the save they belong to (accelerate's ``pytorch_model_fsdp_0/`` → its ``pretrained_model/``),
    and inside a bare DCP dir (torchtitan's ``step-N/``) - never in a parent its sibling steps share.
    ``dtype``: ``fp32`` / ``bf16`` / ``fp16`` for floating tensors (default: as saved, which
    is fp32 for master weights). ``what``: ``model`` or ``optimizer`` (default: ``model``, or
    what a DCP dir given directly holds). ``key``: the dotted key path of the subtree to convert
    (``app.model``); without it the model (or optimizer) part is found by its shape
    (:mod:`ckpt_tools.dcp.selection`), never mixed with training state. ``verify``: re-read every written byte and compare it
    with the shards before committing (always done with ``delete_dcp``). ``overwrite``: replace
    existing output files (refused otherwise, unless they already hold exactly the planned
    bytes). ``delete_dcp``: then delete the DCP dir - refused before any work unless what
    remains resumes bit-exactly, or ``allow_unresumable`` (which waives only that rule).
    ``ema``: convert the EMA weights (``pretrained_model_ema/pytorch_model_fsdp_0/``, a
    ``--ema.enable=true`` run's sharded shadow) instead of the live ones; written by default
    into ``pretrained_model_ema/``, where LeRobot keeps its EMA ``model.safetensors``.
    Raises :class:`~ckpt_tools.errors.CkptError` only.
    """
    start = time.perf_counter()
    if ema and what not in (None, "model"):
        raise UsageError(f"--ema converts the EMA weights, a model: not with --what {what}")
    if ema and delete_dcp:
        raise UsageError("--ema with --delete-dcp: deleting the EMA shards is not supported; convert, then keep them")
    out_dtype = _output_dtype(dtype)
    shard_limit = parse_size(max_shard_size) if max_shard_size is not None else None
    if what is not None and what not in WHAT_CHOICES:
        raise UsageError(f"--what must be one of {', '.join(WHAT_CHOICES)}, got {what!r}")
    named = as_path(checkpoint_dir)
    source = _resolve_source(named, what) if not ema else _resolve_ema_source(named)
    if source.interrupted:
        return _finish_interrupted(source, dry_run=dry_run, start=start)
    if source.pieces is not None:
        _check_pieces_request(source, output, delete_dcp)
        index = source.pieces.to_index()
    else:
        if delete_dcp:
            convert_delete.check_location(named, source.dcp_dir)  # before any work
        index = ChunkIndex.load(source.dcp_dir)
    # Shards: every chunk archive too (a fraction of a second while the index vouches for them);
    # pieces of torch's HF storage are safetensors entries whose headers were read already.
    validate.require_valid(
        validate.structure_problems(index) or ([] if source.pieces else validate.archive_problems(index, objects=False))
    )
    with ShardFiles(index.root) as files:
        plan, layouts = _plan(index, source, files, out_dtype, shard_limit, output, key, what is not None)
        if delete_dcp and plan.skipped:  # never waived: the shards hold the only copy of those tensors
            raise UsageError(
                f"--delete-dcp: {len(plan.skipped)} tensors ({', '.join(plan.skipped[:3])}) have a dtype safetensors"
                " cannot hold and would be lost with the shards; convert without --delete-dcp"
            )
        deletion = Deletion.of(
            named,
            plan.dcp_dir,
            source.step,
            {t.name: t.dtype.name for f in plan.files for t in f.tensors},
            {t.name: t.src_dtype.name for f in plan.files for t in f.tensors},
            allow_unresumable=allow_unresumable,
        )
        if delete_dcp:
            deletion.check(plan.output_dir, written=plan.output_paths)
        if dry_run:
            notes = plan.notes + (("--delete-dcp ignored: dry run",) if delete_dcp else ())
            existing = [p for p in plan.output_paths if p.exists()]
            if existing:
                verb = (
                    "would be replaced (--overwrite)"
                    if overwrite
                    else "exists: kept if it already holds exactly these tensors, else the conversion needs --overwrite"
                )
                notes += (f"{existing[0]} {verb}",)
            return ConvertResult(
                plan,
                tuple(plan.output_paths),
                plan.tensor_count,
                plan.total_bytes,
                True,
                seconds=time.perf_counter() - start,
                notes=notes,
                deletion=deletion,
            )
    with _owning(plan.output_dir):
        return _convert_owned(plan, layouts, index, source, overwrite, verify, delete_dcp, progress, deletion, start)


def _convert_owned(
    plan: ConvertPlan,
    layouts: Mapping[str, list[ChunkLayout]],
    index: ChunkIndex,
    source: _Source,
    overwrite: bool,
    verify: bool,
    delete_dcp: bool,
    progress: bool,
    deletion: Deletion,
    start: float,
) -> ConvertResult:
    """Write (and delete the shards), owning the output directory (:func:`_owning`)."""
    with ShardFiles(index.root) as files:
        notes = _clean_leftovers(plan, source)
        verify = verify or delete_dcp
        if not overwrite and _outputs_identical(plan, layouts, files):
            written, verify = plan.output_paths, True
            notes += (f"kept the existing {plan.output_paths[0].name}: it already holds exactly these tensors",)
        else:
            _check_outputs(plan, overwrite)
            try:
                written = _write_all(plan, layouts, files, progress=progress, verify=verify, exclusive=not overwrite)
            except MemoryError:
                # Tensors that are not row slabs are assembled in memory, one at a time.
                raise WriteError(
                    "not enough memory to assemble the largest tensor (non-row-sharded tensors are built in memory"
                    " one at a time); nothing was written"
                ) from None
            inside = [p for p in written if source.step and p.resolve().is_relative_to(source.step.root.resolve())]
            if source.step is not None and inside:  # files written into the step are the step's from now on
                save_files.amend(source.step, inside)
    result = ConvertResult(
        plan,
        tuple(written),
        plan.tensor_count,
        plan.total_bytes,
        False,
        verified=verify,
        seconds=time.perf_counter() - start,
        notes=plan.notes + notes,
        deletion=deletion,
        identities=tuple(_identity(p) for p in written),
    )
    return _delete_verified(result) if delete_dcp else result


def delete_converted_dcp(result: ConvertResult) -> ConvertResult:
    """Remove the DCP directory of a conversion whose output was verified (and only then).

    Separate from :func:`convert_dcp` so a caller can do something in between - the CLI
    publishes to the Hub first and deletes only after the upload succeeded. Owns the output
    directory again while it checks and deletes, and deletes only if the output files are
    still the very ones verified (another conversion may have replaced them in between).
    """
    with _owning(result.plan.output_dir):
        return _delete_verified(result)


def _delete_verified(result: ConvertResult) -> ConvertResult:
    """The deletion, while this process owns the output directory: the files verified are the files there."""
    if result.dry_run or not result.verified or result.deletion is None:
        raise UsageError("refusing to delete DCP shards: the conversion was not written and verified")
    missing = [p for p in result.output_files if not p.is_file()]
    if missing:
        raise WriteError(f"{missing[0]}: converted output vanished; DCP shards kept")
    changed = [p for p, was in zip(result.output_files, result.identities, strict=False) if _identity(p) != was]
    if changed:
        raise WriteError(
            f"{changed[0]}: replaced since this conversion verified it (another process wrote it); DCP shards kept"
        )
    result.deletion.check(result.plan.output_dir)
    convert_delete.delete_dcp_dir(result.plan.dcp_dir)
    return replace(result, deleted_dcp=True)


def _identity(path: Path) -> tuple[int, ...]:
    """Which file ``path`` is now: device, inode, size and modification time (all equal: not replaced)."""
    try:
        st = path.stat()
    except OSError:
        return ()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@contextlib.contextmanager
def _owning(output_dir: Path) -> Iterator[None]:
    """This process owns ``output_dir`` (:mod:`ckpt_tools.io.dir_lock`) while it writes and deletes there:
    a second conversion into it is refused in one line instead of replacing the first one's files."""
    created = None if output_dir.exists() else _existing_parent(output_dir)
    lock = DirLock(output_dir, "convert-dcp")
    try:
        lock.acquire()
    except DirLocked as e:
        raise WriteError(f"{e}; one conversion per output directory at a time: wait for it to end") from None
    except OSError as e:
        raise WriteError(f"{output_dir}: cannot take its lock ({e.strerror or e})") from None
    try:
        yield
    finally:
        lock.release()
        if created is not None:
            _remove_empty_dirs(output_dir, created)


def _clean_leftovers(plan: ConvertPlan, source: _Source) -> tuple[str, ...]:
    """Before writing: remove what a killed earlier run of this conversion left (its temporaries, its deletion)."""
    names = [p.name for p in plan.output_paths]
    notes = convert_delete.remove_own_temporaries(plan.output_dir, names)
    notes += convert_delete.finish_deletes(convert_delete.interrupted_deletes(source.dcp_dir))
    return tuple(notes)


def _finish_interrupted(source: _Source, *, dry_run: bool, start: float) -> ConvertResult:
    """The DCP dir is gone because an earlier ``--delete-dcp`` moved it aside and was stopped: finish that.

    Its conversion was committed and verified before the move, so there is nothing to convert.
    """
    notes = [f"nothing to convert: an earlier --delete-dcp converted {source.dcp_dir.name}/ and was interrupted"]
    if dry_run:
        notes += [f"would finish deleting {lo.path.name}" for lo in source.interrupted]
    else:
        notes += convert_delete.finish_deletes(source.interrupted)
    pm = source.pretrained_model
    plan = ConvertPlan(
        dcp_dir=source.dcp_dir,
        output_dir=source.dcp_dir.parent,
        what=source.what,
        peft=source.what == "model" and pm is not None and manifest.is_peft(pm),
        dtype=None,
        files=(),
        index_name=None,
        index=None,
        metadata={},
        notes=tuple(notes),
    )
    elapsed = time.perf_counter() - start
    return ConvertResult(plan, (), 0, 0, dry_run, deleted_dcp=not dry_run, seconds=elapsed, notes=tuple(notes))


# ====================================================================== resolving the input


_WHOLE_STEP = (L.PathKind.CHECKPOINTS_ROOT, L.PathKind.STEP_DIR)  # paths that name a step, not a part of it


@dataclass(frozen=True)
class _Source:
    dcp_dir: Path
    what: str
    pretrained_model: Path | None  # where adapter_config.json would be
    notes: tuple[str, ...] = ()
    step: L.StepPaths | None = None  # the step the DCP dir is in (None: a loose DCP dir)
    interrupted: tuple[Leftover, ...] = ()  # dcp_dir is gone: an earlier --delete-dcp moved it aside, unfinished
    pieces: hf_storage.HfStorage | None = None  # dcp_dir holds torch's HF-storage pieces, not .distcp shards


def _resolve_source(path: Path, what: str | None) -> _Source:
    """The DCP directory to convert: in the step ``path`` means (:func:`~ckpt_tools.format.layout.resolve_step`),
    or a DCP dir / ``pretrained_model/`` / ``training_state/`` given directly, in a step or not.

    A DCP dir that an interrupted ``--delete-dcp`` already moved aside resolves with ``interrupted`` set.
    """
    if not path.exists() and not path.is_symlink():
        pending = convert_delete.interrupted_deletes(path)
        if pending:
            guess = "optimizer" if path.name == L.OPTIMIZER_DCP_DIR else "model"
            return _Source(path, what or guess, None, interrupted=tuple(pending))
    located = L.locate(path)
    kind = located.kind
    if kind is L.PathKind.TRAINER_ROOT:
        newest = L.newest_trainer_step(located.path)
        note = f"converting {newest.name}, the newest save in {located.path}"
        return replace(_resolve_source(newest, what), notes=(note,))
    if kind in (L.PathKind.SAFETENSORS_FILE, L.PathKind.SAFETENSORS_DIR):
        return _pieces_source(located, what)
    step = L.resolve_step(path) if kind in _WHOLE_STEP or located.step is not None else None
    notes: tuple[str, ...] = ()
    if kind is L.PathKind.CHECKPOINTS_ROOT:
        assert step is not None
        notes = (f"converting {step.root.name}, the step 'last' points at",)
    if kind is L.PathKind.DCP_DIR:
        dcp_dir = located.path
        if what is None:
            what = "optimizer" if dcp_dir.name.startswith(L.OPTIMIZER_DCP_DIR.rsplit("_", 1)[0]) else "model"
        pm = dcp_dir.parent if (dcp_dir.parent / L.ADAPTER_CONFIG).exists() or step is None else step.pretrained_model
        return _Source(dcp_dir, what, pm, notes, step)
    what = what or "model"
    if kind in _WHOLE_STEP:
        assert step is not None
        pm, ts = step.pretrained_model, step.training_state
    elif kind is L.PathKind.PRETRAINED_MODEL:
        pm, ts = located.path, (step.training_state if step else located.path.parent / L.TRAINING_STATE_DIR)
    else:  # training_state/
        ts, pm = located.path, (step.pretrained_model if step else located.path.parent / L.PRETRAINED_MODEL_DIR)
    dcp_dir = pm / L.MODEL_DCP_DIR if what == "model" else ts / L.OPTIMIZER_DCP_DIR
    if not dcp_dir.is_dir() and not dcp_dir.is_symlink():
        pending = convert_delete.interrupted_deletes(dcp_dir)
        if pending:
            return _Source(dcp_dir, what, pm, notes, step, tuple(pending))
    if not dcp_dir.is_dir():
        if what == "model" and ((pm / L.MODEL_WEIGHTS).exists() or (pm / L.ADAPTER_WEIGHTS).exists()):
            raise CheckpointError(
                f"{pm}: no {L.MODEL_DCP_DIR}/ to convert - the weights are already in safetensors form"
            )
        raise CheckpointError(f"{dcp_dir}: missing - this checkpoint has no DCP shards for the {what}")
    return _Source(dcp_dir, what, pm, notes, step)


def _resolve_ema_source(path: Path) -> _Source:
    """The EMA shadow's DCP directory of the step ``path`` is in (``pretrained_model_ema/pytorch_model_fsdp_0/``)."""
    located = L.locate(path)
    if located.kind is L.PathKind.DCP_DIR:
        if located.path.parent.name != L.PRETRAINED_MODEL_EMA_DIR:
            raise CheckpointError(f"{path}: not the EMA shards (those are in {L.PRETRAINED_MODEL_EMA_DIR}/)")
        return _Source(located.path, "model", located.path.parent, (), located.step)
    if located.kind is L.PathKind.PRETRAINED_MODEL and located.path.name == L.PRETRAINED_MODEL_EMA_DIR:
        step = located.step
    else:
        step = L.resolve_step(path)
    if step is None:
        raise CheckpointError(
            f"{path}: not inside a checkpoint step directory (no {L.PRETRAINED_MODEL_EMA_DIR}/ to find)"
        )
    ema_dir = step.pretrained_model_ema
    if not step.ema_model_dcp.is_dir():
        if step.ema_model_weights.exists():
            raise CheckpointError(
                f"{ema_dir}: no {L.MODEL_DCP_DIR}/ to convert - the EMA weights are already in safetensors form"
            )
        raise CheckpointError(no_ema_weights(step))
    notes = (f"converting the EMA weights of {step.root.name}",)
    return _Source(step.ema_model_dcp, "model", ema_dir, notes, step)


def _pieces_source(located: L.Located, what: str | None) -> _Source:
    """A folder of safetensors (or one file of it): torch's HF-storage pieces to merge, or nothing to convert."""
    folder = located.path if located.kind is L.PathKind.SAFETENSORS_DIR else located.path.parent
    store = hf_storage.load(folder)
    hf_storage.require_sound(store)
    if not store.needs_merge:
        layout = " (torch's HF-storage layout, every tensor whole)" if store.sharding_info else ""
        raise CheckpointError(
            f"{located.path}: nothing to convert - already safetensors holding {len(store.pieces)} whole tensors{layout}"
        )
    notes = () if folder == located.path else (f"merging every piece in {folder}/, not only {located.path.name}",)
    return _Source(folder, what or "model", None, notes, pieces=store)


def _check_pieces_request(source: _Source, output: str | os.PathLike[str] | None, delete_dcp: bool) -> None:
    if delete_dcp:
        raise UsageError(
            f"{source.dcp_dir}: --delete-dcp removes DCP shard directories only, not torch's HF-storage pieces"
        )
    if output is None:
        raise UsageError(
            f"{source.dcp_dir}: holds torch's HF-storage pieces; give --output DIR (or FILE.safetensors) for the merged"
            " tensors, which would otherwise mix with the pieces"
        )


def _output_dtype(dtype: str | None) -> DType | None:
    if dtype is None or dtype in ("", "keep", "auto"):
        return None
    name = dtypes.OUTPUT_DTYPES.get(dtype.lower(), dtypes.canonical_name(dtype.lower()))
    if name not in dtypes.OUTPUT_DTYPES.values():
        raise UsageError(f"--dtype must be one of {', '.join(dtypes.OUTPUT_DTYPES)}, got {dtype!r}")
    return dtypes.BY_NAME[name]


# ====================================================================== planning


class _Layouts(Mapping[str, list[ChunkLayout]]):
    """Each planned tensor's chunk layouts, read from the archive headers when first needed.

    A plan (and a dry run) needs none; the writer needs each tensor's just before copying it.
    One :class:`~ckpt_tools.dcp.archives.ArchiveChecker` serves them all, so chunks alike are
    compared with the first one's headers instead of parsed.
    """

    def __init__(self, files: ShardFiles, pieces: dict[str, list[ChunkLayout]] | None) -> None:
        self._files = files
        self._pieces = pieces
        self._entries: dict[str, TensorEntry] = {}
        self._done: dict[str, list[ChunkLayout]] = {}
        self._checker: ArchiveChecker | None = None

    def add(self, entry: TensorEntry) -> None:
        self._entries[entry.fqn] = entry

    def __getitem__(self, fqn: str) -> list[ChunkLayout]:
        found = self._done.get(fqn)
        if found is None:
            if self._pieces is not None:
                found = self._pieces[fqn]
            else:
                entry = self._entries[fqn]
                if self._checker is None:
                    self._checker = ArchiveChecker(entry.table, self._files)
                found = validate.tensor_layouts(entry, self._files, self._checker)
            self._done[fqn] = found
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def _plan(
    index: ChunkIndex,
    source: _Source,
    files: ShardFiles,
    out_dtype: DType | None,
    shard_limit: int | None,
    output: str | os.PathLike[str] | None,
    key: str | None = None,
    what_given: bool = False,
) -> tuple[ConvertPlan, _Layouts]:
    notes = list(source.notes)
    sel = selection.select(index, key=key, what=source.what, what_given=what_given)
    if sel.picked:
        notes.append(sel.picked)
    names: dict[str, TensorEntry] = {}
    skipped_outside = 0
    for entry in index.tensors.values():
        if not sel.contains(entry.path):
            skipped_outside += 1
            continue
        names[sel.name(entry.path)] = entry
    if skipped_outside:
        notes.append(f"skipped {skipped_outside} tensors outside {sel.label}")
    if not names:
        raise CheckpointError(f"{index.root}: no tensors under {sel.label} to convert")
    source = replace(source, what=sel.what)

    peft = False
    if source.what == "model":
        peft = manifest.is_peft(source.pretrained_model, weight_names=names)
        if peft:
            renamed = {peft_keys.saved_adapter_key(k): v for k, v in names.items()}
            if len(renamed) != len(names):
                raise CheckpointError(f"{index.root}: two adapter keys map to the same saved name")
            names = renamed
            if shard_limit is not None:
                raise UsageError("--max-shard-size: PEFT adapters are saved as one adapter_model.safetensors")

    layouts = _Layouts(files, source.pieces.layouts() if source.pieces is not None else None)
    planned: list[PlannedTensor] = []
    unrepresentable: dict[str, list[str]] = {}
    for name in sorted(names):
        entry = names[name]
        src = dtypes.BY_NAME.get(dtypes.canonical_name(entry.dtype))
        if src is None or not src.representable or src.safetensors_shape(entry.shape) is None:  # skipped, never fatal
            unrepresentable.setdefault(dtypes.canonical_name(entry.dtype), []).append(name)
            continue
        dst = out_dtype if (out_dtype is not None and src.name in casting.CASTABLE) else src
        layouts.add(entry)
        planned.append(PlannedTensor(name, entry, src, dst))
    for dtype_name, skipped in sorted(unrepresentable.items()):
        shown = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
        notes.append(f"skipped {len(skipped)} {dtype_name} tensors ({shown}): safetensors cannot hold {dtype_name}")
    if not planned:
        raise CheckpointError(f"{index.root}: no tensor under {sel.label} has a dtype safetensors can hold")
    if out_dtype is not None:
        kept = {t.src_dtype for t in planned if t.src_dtype.name not in casting.CASTABLE}
        plain = sorted(d.name for d in kept if not d.floating)
        uncastable = sorted(d.name for d in kept if d.floating)
        if plain:
            notes.append(f"non-float tensors keep their dtype ({', '.join(plain)})")
        if uncastable:  # torch defines no cast from them either
            notes.append(f"{', '.join(uncastable)} tensors keep their dtype: no cast to {out_dtype.name} is defined")

    metadata = {"format": "pt"}
    if source.what == "optimizer":
        objects, skipped = _decode_objects(index, sel, files)
        for key, value in objects.items():  # param_groups, and any non-tensor state entries
            metadata[key] = json.dumps(value, sort_keys=True, allow_nan=True)
        notes.extend(skipped)
    elif any(sel.contains(b.path) for b in index.byte_items.values()):
        inside = sum(sel.contains(b.path) for b in index.byte_items.values())
        notes.append(f"skipped {inside} non-tensor items (not weights)")

    stem = "adapter_model" if peft else ("model" if source.what == "model" else OPTIMIZER_OUTPUT_STEM)
    output_dir, single_name = _output_location(source, output, shard_limit, stem)
    specs = [t.to_write() for t in planned]
    shards = plan_shards(specs, shard_limit, stem=stem)
    by_name = {t.name: t for t in planned}
    planned_files = []
    for filename, tensor_names in shards.files.items():
        if shards.index is None and single_name is not None:
            filename = single_name
        planned_files.append(PlannedFile(filename, tuple(by_name[n] for n in tensor_names)))
    plan = ConvertPlan(
        dcp_dir=index.root,
        output_dir=output_dir,
        what=source.what,
        peft=peft,
        dtype=out_dtype.name if out_dtype else None,
        files=tuple(planned_files),
        index_name=f"{stem}.safetensors.index.json" if shards.index is not None else None,
        index=shards.index,
        metadata=metadata,
        notes=tuple(notes),
        selected=selection.dotted(sel.prefix),
        left_out=tuple(selection.dotted(p) for p in sel.left_out),
        skipped=tuple(n for names in unrepresentable.values() for n in names),
    )
    return plan, layouts


def _output_location(
    source: _Source, output: str | os.PathLike[str] | None, shard_limit: int | None, stem: str
) -> tuple[Path, str | None]:
    if output is None:
        return default_output_dir(source.dcp_dir, source.step), None
    out = Path(output)
    if out.suffix == ".safetensors":
        if shard_limit is not None:
            raise UsageError("--output: give a directory when --max-shard-size may produce several files")
        return out.parent, out.name
    return out, None


def default_output_dir(dcp_dir: Path, step: L.StepPaths | None) -> Path:
    """Where a conversion writes without ``--output``: the save folder that owns the shards.

    accelerate's DCP dirs (``pytorch_model_fsdp_0/``, ``optimizer_0/``) and any DCP dir inside a
    step belong to the folder holding them; a bare DCP dir (torchtitan's ``step-N/``, a
    ``dcp.save(checkpoint_id=...)`` dir) is its own save, and its parent may hold sibling steps
    whose conversions would collide there - so the output goes inside it.
    """
    if step is not None or dcp_dir.name in (L.MODEL_DCP_DIR, L.OPTIMIZER_DCP_DIR):
        return dcp_dir.parent
    return dcp_dir


def _decode_objects(index: ChunkIndex, sel: selection.Selection, files: ShardFiles) -> tuple[dict[str, Any], list[str]]:
    """Non-tensor optimizer items (param_groups...) as plain data, by key under the selection; others skipped, noted."""
    tree: dict[Any, Any] = {}
    skipped: list[str] = []
    depth = len(sel.prefix)
    for item in index.byte_items.values():
        if not sel.contains(item.path):
            continue
        what = f"{item.file} ({item.fqn})"
        try:
            fd, start, length = files.span(item, limit=validate.OBJECT_LIMIT)
            loaded = read_pickled_object(fd, start, length, validate.PLAIN_OBJECTS, what=what)
            value = plain_data(loaded)
        except (CkptError, ValueError) as e:
            skipped.append(f"skipped non-tensor item {item.fqn}: {e}")
            continue
        node = tree
        for part in item.path[depth:-1]:
            node = node.setdefault(part, {})
        node[item.path[-1]] = value
    return {str(k): _listify(v) for k, v in tree.items()}, skipped


def _listify(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    items = {k: _listify(v) for k, v in node.items()}
    if items and all(isinstance(k, int) for k in items) and sorted(items) == list(range(len(items))):
        return [items[i] for i in range(len(items))]
    return {str(k): v for k, v in items.items()}


# ====================================================================== writing


def _check_outputs(plan: ConvertPlan, overwrite: bool) -> None:
    existing = [p for p in plan.output_paths if p.exists()]
    if existing and not overwrite:
        raise UsageError(
            f"{existing[0]}: already exists and is not exactly what this conversion writes (other tensors, dtype"
            " or shards, or an incomplete set); pass --overwrite to replace it"
        )
    need = plan.total_bytes
    probe = plan.output_dir if plan.output_dir.exists() else _existing_parent(plan.output_dir)
    try:
        st = os.statvfs(probe)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise WriteError(f"{plan.output_dir}: not enough space ({human_bytes(need)} needed, {human_bytes(free)} free)")


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _write_all(
    plan: ConvertPlan,
    layouts: Mapping[str, list[ChunkLayout]],
    files: ShardFiles,
    *,
    progress: bool,
    verify: bool,
    exclusive: bool,
) -> list[Path]:
    """Write, verify and commit every output file (``exclusive``: none may exist; one that appears
    meanwhile stops the conversion, and the files it already placed are removed again)."""
    created_dir = None
    placed: list[Path] = []
    if not plan.output_dir.exists():
        created_dir = _existing_parent(plan.output_dir)
        try:
            plan.output_dir.mkdir(parents=True)
        except OSError as e:
            raise WriteError(f"{plan.output_dir}: cannot create ({e.strerror})") from None
    writers: list[StreamingWriter] = []
    index_writer = _IndexWriter(plan) if plan.index is not None else None
    bar = _progress_bar(plan.total_bytes, enabled=progress)
    try:
        for planned_file in plan.files:
            writer = StreamingWriter(
                plan.output_dir / planned_file.name, [t.to_write() for t in planned_file.tensors], plan.metadata
            )
            writers.append(writer)
            writer.open()
            for tensor in planned_file.tensors:
                writer.begin(tensor.name)
                for piece in tensor_pieces(tensor.source, layouts[tensor.source.fqn], files, tensor.dtype):
                    if isinstance(piece, Copy):
                        writer.copy_from(piece.fd, piece.offset, piece.length, what=piece.what)
                        bar.update(piece.length)
                    else:
                        writer.write(piece)
                        bar.update(len(piece))
                writer.end()
            writer.finish()
        if verify:
            for writer, planned_file in zip(writers, plan.files, strict=True):
                assert writer.tmp is not None
                _verify_file(writer.tmp, planned_file, layouts, files, plan.metadata)
        if index_writer is not None:
            index_writer.write()
        for writer in writers:
            writer.commit(exclusive=exclusive)
            placed.append(writer.path)
        if index_writer is not None:
            index_writer.commit(exclusive=exclusive)
    except BaseException:
        for writer in writers:
            writer.abort()
        if index_writer is not None:
            index_writer.abort()
        for path in placed if exclusive else ():  # created by this conversion a moment ago
            path.unlink(missing_ok=True)
        if created_dir is not None:
            _remove_empty_dirs(plan.output_dir, created_dir)
        raise
    finally:
        bar.close()
    fsync_dir(plan.output_dir)
    return plan.output_paths


class _IndexWriter:
    """``*.safetensors.index.json`` through a temporary sibling, renamed after the shards."""

    def __init__(self, plan: ConvertPlan) -> None:
        assert plan.index_name is not None
        self.path = plan.output_dir / plan.index_name
        self.payload = index_payload(plan)
        self._sibling: TempSibling | None = None

    def write(self) -> None:
        try:
            self._sibling = TempSibling(self.path)
            with self._sibling.open("w") as f:
                f.write(self.payload)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            self.abort()
            raise WriteError(f"{self.path}: write failed ({e.strerror})") from None

    def commit(self, *, exclusive: bool = False) -> None:
        assert self._sibling is not None
        try:
            self._sibling.commit(exclusive=exclusive)
        except FileExistsError:
            raise WriteError(
                f"{self.path}: appeared while this conversion was writing (another process wrote it)"
            ) from None

    def abort(self) -> None:
        if self._sibling is not None:
            self._sibling.abort()


def index_payload(plan: ConvertPlan) -> str:
    """The text of the plan's ``*.safetensors.index.json``."""
    return json.dumps(plan.index, indent=2) + "\n"


def _outputs_identical(plan: ConvertPlan, layouts: Mapping[str, list[ChunkLayout]], files: ShardFiles) -> bool:
    """Whether every planned output already exists holding exactly the planned bytes (a rerun after a kill).

    Read back and compared like a verification; any difference (or unreadable file) means no.
    """
    if not all(p.is_file() for p in plan.output_paths):
        return False
    try:
        for planned_file in plan.files:
            _verify_file(plan.output_dir / planned_file.name, planned_file, layouts, files, plan.metadata)
        if plan.index_name is not None:
            return (plan.output_dir / plan.index_name).read_text(encoding="utf-8") == index_payload(plan)
    except (CkptError, OSError, UnicodeDecodeError):
        return False
    return True


def _remove_empty_dirs(path: Path, stop: Path) -> None:
    while path != stop and path.is_dir():
        try:
            path.rmdir()
        except OSError:
            return
        path = path.parent


# ====================================================================== verification


def _verify_file(
    path: Path,
    planned: PlannedFile,
    layouts: Mapping[str, list[ChunkLayout]],
    files: ShardFiles,
    metadata: dict[str, str],
) -> None:
    """Re-read ``path`` and compare header and every byte with what the chunks say it must hold."""
    header = read_header(path)
    final = path.name
    if header.problems:
        raise WriteError(f"{final}: written file failed its header check ({header.problems[0]}); nothing deleted")
    if list(header.entries) != [t.name for t in planned.tensors] or header.metadata != metadata:
        raise WriteError(f"{final}: written header does not match the plan; nothing deleted")
    fd = os.open(path, os.O_RDONLY)
    try:
        for tensor in planned.tensors:
            entry = header.entries[tensor.name]
            if entry.dtype != tensor.dtype.safetensors or entry.shape != tensor.dtype.safetensors_shape(tensor.shape):
                raise WriteError(f"{final}: {tensor.name} has the wrong dtype or shape; nothing deleted")
            pos = header.data_start + entry.begin
            for piece in tensor_pieces(tensor.source, layouts[tensor.source.fqn], files, tensor.dtype):
                for expected, n in _piece_blocks(piece):
                    got = pread_exact(fd, n, pos, what=str(path))
                    if got != expected:
                        raise WriteError(
                            f"{final}: {tensor.name} differs from the DCP shards after writing; nothing deleted"
                        )
                    pos += n
    finally:
        os.close(fd)


def _piece_blocks(piece: Copy | memoryview) -> Iterator[tuple[bytes | memoryview, int]]:
    if isinstance(piece, Copy):
        for off in range(0, piece.length, COPY_BLOCK):
            n = min(COPY_BLOCK, piece.length - off)
            yield pread_exact(piece.fd, n, piece.offset + off, what=piece.what), n
    else:
        for off in range(0, len(piece), COPY_BLOCK):
            block = piece[off : off + COPY_BLOCK]
            yield block, len(block)


# ====================================================================== progress


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, *, enabled: bool) -> Any:
    if not enabled or not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="convert-dcp", file=sys.stderr)
