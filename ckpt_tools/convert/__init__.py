"""``convert_dcp``: merge DCP shards into safetensors, streaming, atomically, without torch.

The flow is plan → write → (verify) → commit → (delete):

1. *plan* (:mod:`~ckpt_tools.convert.source`, :mod:`~ckpt_tools.convert.plan`): find the DCP
   directory, load its chunk index and refuse anything unsafe or inconsistent; read every
   chunk's archive header (a few hundred bytes each) so byte counts, dtypes and shapes are
   checked before a single output byte is written; name the outputs.
2. *write* (:mod:`~ckpt_tools.convert.write`): one temporary sibling per output file, tensor
   after tensor, each fsynced.
3. *verify* (with ``delete_dcp``; :mod:`~ckpt_tools.convert.verify`): re-read every written
   byte and compare it with the chunks.
4. *commit*: rename the temporaries into place, the index file last.
5. *delete* (with ``delete_dcp``): only now, and only when what remains still resumes
   bit-exactly (:mod:`~ckpt_tools.convert.delete`), remove the DCP directory - renamed aside
   atomically first, so an interruption leaves the old state or the new one.

Any failure before the commit removes the temporaries: no partial output, inputs untouched.
A rerun after a kill picks up where it stopped: it removes its own abandoned temporaries,
keeps outputs that already hold exactly the planned bytes, and finishes an interrupted deletion.
What to do is one :class:`~ckpt_tools.convert.options.ConvertOptions`, whichever front-end asked.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ckpt_tools.convert import delete
from ckpt_tools.convert.delete import Deletion
from ckpt_tools.convert.options import WHAT_CHOICES, ConvertOptions
from ckpt_tools.convert.output_dir import owning
from ckpt_tools.convert.plan import Layouts, default_output_dir, make_plan
from ckpt_tools.convert.records import OPTIMIZER_OUTPUT_STEM, ConvertPlan, ConvertResult, PlannedFile, PlannedTensor
from ckpt_tools.convert.source import Source, check_pieces_request, resolve
from ckpt_tools.convert.write import check_outputs, index_payload, outputs_identical, write_all
from ckpt_tools.dcp import validate
from ckpt_tools.dcp.files import ShardFiles
from ckpt_tools.dcp.index import ChunkIndex
from ckpt_tools.errors import UsageError, WriteError
from ckpt_tools.format import manifest
from ckpt_tools.format.rules import save_files
from ckpt_tools.io.remote import as_path

__all__ = [
    "OPTIMIZER_OUTPUT_STEM",
    "WHAT_CHOICES",
    "ConvertOptions",
    "ConvertPlan",
    "ConvertResult",
    "PlannedFile",
    "PlannedTensor",
    "convert_dcp",
    "default_output_dir",
    "delete_converted_dcp",
    "index_payload",
]


def convert_dcp(
    checkpoint_dir: str | os.PathLike[str], options: ConvertOptions | None = None, **keywords: Any
) -> ConvertResult:
    """Merge a DCP checkpoint into safetensors, as ``options`` say (:class:`ConvertOptions`).

    ``checkpoint_dir``: a step dir, its ``pretrained_model/`` (or ``training_state/`` for the
    optimizer), a DCP dir itself, a checkpoints root (its ``last`` step), another trainer's
    root of ``step-N/`` saves (its newest), or a folder of torch's HF-storage pieces.
    ``keywords`` is the compatibility spelling, option names as keywords
    (``convert_dcp(path, dry_run=True, progress=False)``): they change ``options`` field by field.
    Raises :class:`~ckpt_tools.errors.CkptError` only.
    """
    checked = (options or ConvertOptions()).but(**keywords).checked()
    return _convert(as_path(checkpoint_dir), checked)


def _convert(named: Path, options: ConvertOptions) -> ConvertResult:
    start = time.perf_counter()
    source = resolve(named, options.what, ema=options.ema)
    if source.interrupted:
        return _finish_interrupted(source, dry_run=options.dry_run, start=start)
    index = _load_index(named, source, options)
    with ShardFiles(index.root) as files:
        plan, layouts = make_plan(index, source, files, options)
        deletion = _deletion(named, source, plan, options)
        if options.dry_run:
            return _dry_run_result(plan, deletion, options, start)
    with owning(plan.output_dir):
        return _convert_owned(plan, layouts, index, source, options, deletion, start)


def _load_index(named: Path, source: Source, options: ConvertOptions) -> ChunkIndex:
    """The source's chunk index, validated: structure, and every chunk archive of ``.distcp`` shards."""
    if source.pieces is not None:
        check_pieces_request(source, options.output, options.delete_dcp)
        index = source.pieces.to_index()
    else:
        if options.delete_dcp:
            delete.check_location(named, source.dcp_dir)  # before any work
        index = ChunkIndex.load(source.dcp_dir)
    # Shards: every chunk archive too (a fraction of a second while the index vouches for them);
    # pieces of torch's HF storage are safetensors entries whose headers were read already.
    validate.require_valid(
        validate.structure_problems(index) or ([] if source.pieces else validate.archive_problems(index, objects=False))
    )
    return index


def _deletion(named: Path, source: Source, plan: ConvertPlan, options: ConvertOptions) -> Deletion:
    """What deleting the shards after this conversion needs; with ``delete_dcp``, refused now if not allowed."""
    if options.delete_dcp and plan.skipped:  # never waived: the shards hold the only copy of those tensors
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
        allow_unresumable=options.allow_unresumable,
    )
    if options.delete_dcp:
        deletion.check(plan.output_dir, written=plan.output_paths)
    return deletion


def _dry_run_result(plan: ConvertPlan, deletion: Deletion, options: ConvertOptions, start: float) -> ConvertResult:
    notes = plan.notes + (("--delete-dcp ignored: dry run",) if options.delete_dcp else ())
    existing = [p for p in plan.output_paths if p.exists()]
    if existing:
        verb = (
            "would be replaced (--overwrite)"
            if options.overwrite
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


def _convert_owned(
    plan: ConvertPlan,
    layouts: Layouts,
    index: ChunkIndex,
    source: Source,
    options: ConvertOptions,
    deletion: Deletion,
    start: float,
) -> ConvertResult:
    """Write (and delete the shards), owning the output directory (:func:`~ckpt_tools.convert.output_dir.owning`)."""
    verify = options.verify or options.delete_dcp
    with ShardFiles(index.root) as files:
        notes = _clean_leftovers(plan, source)
        if not options.overwrite and outputs_identical(plan, layouts, files):
            written, verify = plan.output_paths, True
            notes += (f"kept the existing {plan.output_paths[0].name}: it already holds exactly these tensors",)
        else:
            written = _write_new(plan, layouts, files, source, options, verify)
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
    return _delete_verified(result) if options.delete_dcp else result


def _write_new(
    plan: ConvertPlan, layouts: Layouts, files: ShardFiles, source: Source, options: ConvertOptions, verify: bool
) -> list[Path]:
    """Write the outputs (none there holds them already); those inside the step become the step's."""
    check_outputs(plan, options.overwrite)
    try:
        written = write_all(
            plan, layouts, files, progress=options.progress, verify=verify, exclusive=not options.overwrite
        )
    except MemoryError:
        # Tensors that are not row slabs are assembled in memory, one at a time.
        raise WriteError(
            "not enough memory to assemble the largest tensor (non-row-sharded tensors are built in memory"
            " one at a time); nothing was written"
        ) from None
    inside = [p for p in written if source.step and p.resolve().is_relative_to(source.step.root.resolve())]
    if source.step is not None and inside:  # files written into the step are the step's from now on
        save_files.amend(source.step, inside)
    return written


def delete_converted_dcp(result: ConvertResult) -> ConvertResult:
    """Remove the DCP directory of a conversion whose output was verified (and only then).

    Separate from :func:`convert_dcp` so a caller can do something in between - the CLI
    publishes to the Hub first and deletes only after the upload succeeded. Owns the output
    directory again while it checks and deletes, and deletes only if the output files are
    still the very ones verified (another conversion may have replaced them in between).
    """
    with owning(result.plan.output_dir):
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
    delete.delete_dcp_dir(result.plan.dcp_dir)
    return replace(result, deleted_dcp=True)


def _identity(path: Path) -> tuple[int, ...]:
    """Which file ``path`` is now: device, inode, size and modification time (all equal: not replaced)."""
    try:
        st = path.stat()
    except OSError:
        return ()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _clean_leftovers(plan: ConvertPlan, source: Source) -> tuple[str, ...]:
    """Before writing: remove what a killed earlier run of this conversion left (its temporaries, its deletion)."""
    names = [p.name for p in plan.output_paths]
    notes = delete.remove_own_temporaries(plan.output_dir, names)
    notes += delete.finish_deletes(delete.interrupted_deletes(source.dcp_dir))
    return tuple(notes)


def _finish_interrupted(source: Source, *, dry_run: bool, start: float) -> ConvertResult:
    """The DCP dir is gone because an earlier ``--delete-dcp`` moved it aside and was stopped: finish that.

    Its conversion was committed and verified before the move, so there is nothing to convert.
    """
    notes = [f"nothing to convert: an earlier --delete-dcp converted {source.dcp_dir.name}/ and was interrupted"]
    if dry_run:
        notes += [f"would finish deleting {lo.path.name}" for lo in source.interrupted]
    else:
        notes += delete.finish_deletes(source.interrupted)
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
