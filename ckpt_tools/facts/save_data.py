"""Every byte of a step against the full digests its save recorded (``inspect --verify-data``).

The check every resume and tool runs (:mod:`ckpt_tools.facts.save_files`) reads a few
KiB per bulk file: it tells a file of another save apart, but not a bit flipped in the middle
of a shard by a disk, a network file system or a bad copy. Schema-2 records hold a full digest
of every byte (:mod:`ckpt_tools.io.digest`), computed as the save wrote them; this module
re-reads each recorded file, :data:`~ckpt_tools.io.digest.READ` bytes at a time (memory stays
bounded at any file size), and compares - a whole-file digest, or each piece's digest for a
file many ranks wrote (the gathered ``model.safetensors``), which also says where the damage
is. It checks the stamps too, the DCP ``.metadata``'s ``storage_meta.save_id`` among them.

A step without a record (LeRobot's, other producers', this trainer's before the record
existed), or files recorded without a full digest (a schema-1 record), cannot be verified
byte by byte; :func:`verify` says which, and never pretends.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field

from ckpt_tools.facts.save_stamps import dcp_stamped_id, stamped_id
from ckpt_tools.format import layout as L
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.format.rules import save_stamps
from ckpt_tools.format.rules.save_files import EDITABLE, LISTED, RecordedFile, SaveFiles
from ckpt_tools.io import digest, progress
from ckpt_tools.io.safe_read import open_regular

NO_RECORD = "no record of the save's files (not written by ckpt-train, or before it kept one): no per-byte verification is possible"


@dataclass
class DataVerdict:
    """What reading every recorded byte found."""

    save_id: str
    files: int = 0  # files read whole
    bytes: int = 0
    seconds: float = 0.0  # spent reading and digesting the bytes (the stamps and headers not counted)
    wall: float = 0.0  # the whole verification
    problems: list[str] = field(default_factory=list)
    unverifiable: list[str] = field(default_factory=list)  # recorded without a full digest (schema 1)

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def summary(self, paths: StepPaths) -> str:
        """One line: what was read and at what speed, or the bytes that differ."""
        if self.problems:
            shown = "; ".join(self.problems[:LISTED])
            more = f"; and {len(self.problems) - LISTED} more" if len(self.problems) > LISTED else ""
            return f"{paths.root}: bytes that are not what save {self.save_id[:12]} wrote ({shown}{more})"
        return (
            f"{self.files} files, {self.bytes / 1e6:.1f} MB: every byte as save {self.save_id[:12]} wrote it"
            f" (read and digested at {self.gb_per_s:.2f} GB/s; {self.wall:.2f} s in all)"
        )


def verify(paths: StepPaths, saved: SaveFiles, under: str | None = None) -> DataVerdict:
    """Read every byte of every file ``saved`` records (``under``: only those below that relative path)."""
    verdict = DataVerdict(saved.save_id)
    buffer = bytearray(digest.READ)
    started = time.perf_counter()
    chosen = [(rel, recorded) for rel, recorded in saved.files.items() if _chosen(rel, under)]
    progress.current().expect(sum(recorded.size for _, recorded in chosen if recorded.verifiable))
    for rel, recorded in chosen:
        if not recorded.verifiable:
            verdict.unverifiable.append(rel)
            continue
        verdict.problems += _check_file(paths, rel, recorded, verdict, buffer)
        if rel.endswith("/" + L.DCP_METADATA):
            stamped = dcp_stamped_id((paths.root / rel).parent)
            if stamped is not None and stamped != saved.save_id:
                verdict.problems.append(save_stamps.problem(rel, stamped, saved.save_id))
    verdict.wall = time.perf_counter() - started
    return verdict


def _chosen(rel: str, under: str | None) -> bool:
    """Whether :func:`verify` reads the recorded file ``rel``: never an editable one; below ``under``, if given."""
    if rel in EDITABLE:
        return False
    return under is None or rel.startswith(under.rstrip("/") + "/") or rel == under


def _check_file(
    paths: StepPaths, rel: str, recorded: RecordedFile, verdict: DataVerdict, buffer: bytearray
) -> list[str]:
    path = paths.root / rel
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return []  # a missing part is the manifest's concern (as for the save-files check)
    except OSError as e:
        return [f"{rel}: cannot be read ({e.strerror})"]
    if not stat.S_ISREG(st.st_mode):
        return [f"{rel}: no longer a regular file"]
    if st.st_size != recorded.size:
        return [f"{rel}: {st.st_size} bytes, the save wrote {recorded.size}"]
    stamped = stamped_id(path)
    found = [save_stamps.problem(rel, stamped, verdict.save_id)] if stamped not in (None, verdict.save_id) else []
    try:
        fd = open_regular(path)
    except OSError as e:
        return [f"{rel}: cannot be read ({e.strerror})"]
    try:
        pieces = recorded.pieces or ((0, recorded.size, recorded.full or ""),)
        bad = []
        started = time.perf_counter()
        for offset, length, expected in pieces:
            got, read = digest.of_range(fd, offset, length, buffer, on_read=progress.current().advance)
            verdict.bytes += read
            if read != length or got != expected:
                bad.append((offset, length))
        verdict.seconds += time.perf_counter() - started
        verdict.files += 1
    except OSError as e:
        return [*found, f"{rel}: unreadable ({e.strerror or e})"]
    finally:
        os.close(fd)
    if bad and recorded.pieces:
        offset, length = bad[0]
        more = f" and {len(bad) - 1} more ranges" if len(bad) > 1 else ""
        found.append(f"{rel}: bytes {offset}-{offset + length - 1} differ from what the save wrote{more}")
    elif bad:
        found.append(f"{rel}: its bytes differ from what the save wrote (full digest)")
    return found
