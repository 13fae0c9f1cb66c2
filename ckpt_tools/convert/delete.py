"""``convert-dcp --delete-dcp``: when the shards may go, and deleting them so nothing is ever half gone.

The shards are often the only full-precision copy of a run, so deleting them is refused
unless every one of these holds:

- *where*: every path resolved (``realpath``), the directory to delete lies inside what the
  user named - a ``last`` or ``pretrained_model/`` symlinked elsewhere is refused - and the
  output is not inside it;
- *what remains*: a complete checkpoint the trainer resumes bit-exactly - the manifest's
  rule (:func:`ckpt_tools.facts.removal.removal_refusal`) and a conversion without a cast
  (:func:`ckpt_tools.format.rules.master_copy_problem`). ``--allow-unresumable`` accepts less,
  and only this half.

The deletion (:func:`delete_dcp_dir`) renames the directory aside in one atomic step and only
then removes the hidden copy, so an interruption leaves the old state or the new one; a rerun
finishes a deletion an earlier run left half done (:func:`interrupted_deletes`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ckpt_tools.errors import UsageError, WriteError
from ckpt_tools.facts.removal import dcp_part_at, removal_refusal
from ckpt_tools.format import layout as L
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.manifest import Part
from ckpt_tools.format.rules import master_copy_problem
from ckpt_tools.io.fsutil import Leftover, delete_aside, find_leftovers, remove_tree
from ckpt_tools.io.remote import remote_file

ALLOW_FLAG = "--allow-unresumable"


def _real(path: Path) -> Path:
    if remote_file(path) is not None:  # on the Hub: no symlinks, nothing deleted there
        return path
    return Path(os.path.realpath(path))


def named_boundary(named: Path) -> Path:
    """What the user named, resolved: nothing outside it is ever deleted.

    A ``last`` link stands for its checkpoints root (the step it points at must be in there);
    a file (``train_config.json``, ``.metadata``) for its directory.
    """
    p = Path(os.path.abspath(named))
    if p.is_symlink() and p.name == L.LAST_LINK:
        return _real(p.parent)
    if p.is_file():
        p = p.parent
    return _real(p)


def check_location(named: Path, dcp_dir: Path, output_dir: Path | None = None) -> None:
    """Refuse (exit 2) to delete ``dcp_dir`` through a symlink, outside ``named``, or with the output inside it.

    Not waived by ``--allow-unresumable``: these deletions would destroy what the user did not name.
    """
    if dcp_dir.is_symlink():
        raise UsageError(f"--delete-dcp: {dcp_dir} is a symlink; delete the directory it points at yourself")
    real, bound = _real(dcp_dir), named_boundary(named)
    if not real.is_relative_to(bound):
        raise UsageError(
            f"--delete-dcp refused, nothing deleted: {dcp_dir} resolves to {real}, outside {named}"
            " (a symlinked last or pretrained_model/); delete it yourself if you mean to"
        )
    if output_dir is not None and _real(output_dir).is_relative_to(real):
        raise UsageError(
            f"--delete-dcp refused, nothing deleted: the output {output_dir} is inside {dcp_dir}, which would be"
            " deleted with it; give --output outside the shards"
        )


@dataclass(frozen=True)
class Deletion:
    """Everything the decision to delete a conversion's DCP dir needs, fixed when it was planned."""

    named: Path  # the path the user gave
    dcp_dir: Path
    step: StepPaths | None  # the step the DCP dir belongs to (None: a loose DCP dir)
    cast: str | None  # how the output differs from the shards' dtypes (None: the same numbers)
    allow_unresumable: bool = False

    @classmethod
    def of(
        cls,
        named: Path,
        dcp_dir: Path,
        step: StepPaths | None,
        written: Mapping[str, str],
        saved: Mapping[str, str],
        *,
        allow_unresumable: bool = False,
    ) -> Deletion:
        """``written`` / ``saved``: output key -> dtype of the conversion, and as the shards hold it."""
        return cls(named, dcp_dir, step, master_copy_problem(written, saved), allow_unresumable)

    @property
    def part(self) -> Part | None:
        return dcp_part_at(self.step, self.dcp_dir) if self.step is not None else None

    def refusal(self, written: Iterable[Path] = ()) -> str | None:
        """Why what remains after the deletion would not resume bit-exactly (``written``: files still to come)."""
        if self.cast is not None:
            return f"the converted weights are not the copy the shards hold - {self.cast}"
        part = self.part
        if self.step is None or part is None:
            return None  # a DCP dir no resume reads: its lossless, verified conversion replaces it
        return removal_refusal(self.step, part, written=written)

    def check(self, output_dir: Path, written: Iterable[Path] = ()) -> None:
        """Raise :class:`UsageError` (exit 2, nothing deleted) unless the deletion is allowed."""
        check_location(self.named, self.dcp_dir, output_dir)
        if self.allow_unresumable:
            return
        reason = self.refusal(written)
        if reason is not None:
            raise UsageError(
                f"--delete-dcp refused, nothing deleted: {reason}; pass {ALLOW_FLAG} to delete the shards anyway"
            )


def delete_dcp_dir(dcp_dir: Path) -> None:
    """Delete ``dcp_dir`` (its real location) atomically: see :func:`ckpt_tools.io.fsutil.delete_aside`."""
    real = _real(dcp_dir)
    try:
        delete_aside(real)
    except OSError as e:
        if real.exists():
            raise WriteError(
                f"{dcp_dir}: converted and verified, but deleting the shards failed ({e.strerror})"
            ) from None
        raise WriteError(
            f"{dcp_dir}: converted, verified and moved aside, but removing the hidden copy failed ({e.strerror});"
            " rerun the command to finish"
        ) from None


def interrupted_deletes(dcp_dir: Path) -> list[Leftover]:
    """What an interrupted deletion of ``dcp_dir`` left next to it (abandoned: no live process owns it)."""
    real = _real(dcp_dir)
    return [lo for lo in find_leftovers(real.parent) if lo.deleting and lo.target == real.name and lo.abandoned]


def finish_deletes(leftovers: Iterable[Leftover]) -> list[str]:
    """Remove moved-aside directories: their deletion was decided (every check passed) before the move."""
    notes = []
    for lo in leftovers:
        try:
            remove_tree(lo.path)
        except OSError as e:
            raise WriteError(f"{lo.path}: cannot finish an interrupted deletion ({e.strerror})") from None
        notes.append(f"finished deleting {lo.target}/, which an interrupted --delete-dcp had moved aside")
    return notes


def remove_own_temporaries(output_dir: Path, names: Iterable[str]) -> list[str]:
    """Remove the abandoned temporary siblings a killed conversion left in ``output_dir``: those of
    ``names``, and those of any other conversion output (a rerun with another ``--dtype`` or shard
    size writes other names, and would otherwise never remove them)."""
    wanted = set(names)
    notes = []
    for lo in find_leftovers(output_dir):
        ours = lo.target in wanted or lo.target.endswith((".safetensors", ".safetensors.index.json"))
        if lo.deleting or not ours or not lo.abandoned:
            continue
        try:
            lo.path.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise WriteError(f"{lo.path}: cannot remove a leftover temporary file ({e.strerror})") from None
        notes.append(f"removed {lo.path.name}, left by an interrupted conversion")
    return notes
