"""Whether a step's files are the ones its save wrote, decided once for trainer and tools.

Nothing in the formats ties the files of one save together: a ``rng_state.safetensors``, a
``scheduler_state.json`` or a DCP shard copied in from another save of the same run (another
attempt at the same step, a neighbouring step, a colleague's copy) has the right names, types
and shapes, loads without an error, and the promised bit-identical continuation silently does
not happen. So the commit of every save records, in ``training_state/save_files.json``, one
save id and every file it wrote with its size and a BLAKE2b digest: of the whole file for
everything but the bulk data, and of its first and last :data:`SAMPLE` bytes for the bulk (DCP
shard files, and other files over :data:`DIGEST_LIMIT`: weights of large models, a huge
``.metadata``). Those bytes hold tensor data of the first and last chunk, which every update
changes, so a bulk file from another save differs there too, while the check stays a few reads
per file at any size. A bit flipped in the middle of a bulk file is not found this way. A step
whose recorded files differ is refused by the resume and called unhealthy / not resumable by
the tools, with the same line.

Two files are the user's to edit, and an edit is reported, not refused: ``train_config.json``
(a resume starts from it; a moved dataset or output directory is fixed there) and
``adapter_config.json`` (where the PEFT base policy now is). The tools of this project that
change a step (``convert-dcp --overwrite`` into it) record what they wrote (:func:`amend`).

The record lists what the save wrote, not what must be there: a file a tool added later (the
``model.safetensors`` that ``convert-dcp`` writes next to the shards) is not judged here, and a
missing part is the manifest's concern. But a shard file in a DCP directory that the save did
not write is refused - DCP would read it.

Checkpoints that carry no record (LeRobot's, other producers', this trainer's before the
record existed) get only the cross-file counter checks of
:mod:`ckpt_tools.format.rules.consistency`; :func:`describe` says so.

The save id is also stamped into every file whose format has room for it
(:mod:`ckpt_tools.format.rules.save_stamps`); a recorded file stamped by another save is refused
here, with its own entry in the same line. The stamps of bulk files are read with their ends.

Schemas of the record:

* 1 - ``{"schema": 1, "save_id", "files": {rel: {"size", "blake2b" | "sampled"}}}``: the size
  and the BLAKE2b digest of each file (whole, or ``sampled``: of both ends).
* 2 - the same, plus a full digest of every byte of each file (xxh3-128,
  :mod:`ckpt_tools.io.digest`), computed as the save wrote it: ``"xxh3_128"`` of the whole file,
  or ``"xxh3_128_pieces": [[offset, length, digest], ...]`` for a file that many ranks wrote
  parts of (the gathered ``model.safetensors``: each rank's rows), tiling it in offset order.
  Neither is read by the checks above, which stay a few reads per bulk file; ``inspect
  --verify-data`` (:mod:`ckpt_tools.facts.save_data`) reads every byte against them. A
  save made with the digests off (``bin/bench-save``'s comparison) writes entries without them.

Both schemas are read; entries of a schema-1 record simply have no full digest.

A step published to the Hub (``ckpt-tools push --whole-step``) carries copies of its JSON
files with local absolute paths set to null (:mod:`ckpt_tools.hub.local_paths`). Its published
record (:func:`published_copy`) lists those copies as they were published - size, digests and,
for ``train_config.json``, the content - and names them under ``"published_copy"``, so the
downloaded step passes the same checks as the local one and :func:`describe` says which files
were rewritten. The local record is never changed by a push.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import stat
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_tools.errors import CheckpointError, CkptError
from ckpt_tools.format import layout as L
from ckpt_tools.format.layout import StepPaths
from ckpt_tools.io import digest as full_digest
from ckpt_tools.io.fsutil import atomic_write
from ckpt_tools.io.remote import RemoteHandle, pread, remote_file
from ckpt_tools.io.safe_read import open_regular, read_json_file

SCHEMA = 2
READABLE = (1, 2)  # the schemas read (module docstring)
FULL = full_digest.ALGORITHM  # the key of a file's full digest in a schema-2 entry
PIECES = f"{FULL}_pieces"  # ... and of the digests of its pieces
# The file whose saved content the record keeps: what changed in it is named field by field
# (ckpt_tools.format.rules.config_edits), up to this size.
KEPT_CONTENT = f"{L.PRETRAINED_MODEL_DIR}/{L.TRAIN_CONFIG}"
PUBLISHED_COPY = "published_copy"  # files a push published as rewritten copies (module docstring)
CONTENT_LIMIT = 2**18
EDITABLE = frozenset({f"{L.PRETRAINED_MODEL_DIR}/{L.TRAIN_CONFIG}", f"{L.PRETRAINED_MODEL_DIR}/{L.ADAPTER_CONFIG}"})
# Files up to this size are digested whole, at the save and at every check - on every rank of a
# resume, before any process group exists: the JSON records, the RNG state, processors, small
# .metadata. Larger ones (a 7B model's .metadata is 40 MiB at 256 ranks) count as bulk.
DIGEST_LIMIT = 2**20
SAMPLE = 4096  # bytes from each end of a bulk file that its digest covers
_READ = 4 * 2**20
LISTED = 3  # mismatches a line names; the rest are counted


Piece = tuple[int, int, str]  # offset, length, full digest of those bytes


@dataclass(frozen=True)
class RecordedFile:
    size: int
    blake2b: str  # of the whole file, or (``sampled``) of its first and last SAMPLE bytes
    sampled: bool
    full: str | None = None  # schema 2: the full digest of every byte (None: not recorded)
    pieces: tuple[Piece, ...] = ()  # schema 2, instead of ``full``: digests of ranges tiling the file
    content: dict[str, Any] | None = None  # train_config.json as saved (its edits are named field by field)

    @property
    def verifiable(self) -> bool:
        """Whether every byte can be checked against the record (``--verify-data``)."""
        return self.full is not None or bool(self.pieces)


@dataclass(frozen=True)
class SaveFiles:
    """``save_files.json``: one save's id and the files it wrote (paths relative to the step dir)."""

    save_id: str
    files: dict[str, RecordedFile]
    # Files published as rewritten copies (local paths set to null), by relative path: the fields.
    published_copy: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


def record(
    paths: StepPaths, save_id: str, written: dict[str, dict[str, Any]] | None = None, full: bool = True
) -> dict[str, Any]:
    """The record of every file under the step directory now (the commit calls it once the ranks are done).

    ``written``: the full digests the writers computed as they wrote, by relative path
    (:func:`ckpt_tools.train.checkpoint.written_digests.merged`); a file without one (or whose
    size changed since) is digested here, from the page cache the save just filled. ``full``
    false: no full digests at all (the scale generator's sparse terabytes).
    """
    own = paths.save_files.relative_to(paths.root).as_posix()
    written = written or {}
    files = {}
    for path in sorted(_files_under(paths.root)):
        rel = path.relative_to(paths.root).as_posix()
        if rel != own:
            files[rel] = _entry(path, written.get(rel), full)
        if rel == KEPT_CONTENT and files[rel]["size"] <= CONTENT_LIMIT:
            with contextlib.suppress(CkptError):  # not a JSON object: no content to compare an edit with
                files[rel]["content"] = read_json_file(path, want_object=True)
    return {"schema": SCHEMA, "save_id": save_id, "files": files}


def new_save_id() -> str:
    return uuid.uuid4().hex


def write_record(
    paths: StepPaths,
    save_id: str | None = None,
    written: dict[str, dict[str, Any]] | None = None,
    full: bool = True,
) -> None:
    """Write the record of a new save into its (hidden, partial) step directory; the commit's fsyncs make it durable."""
    paths.save_files.write_bytes(encode(record(paths, save_id or new_save_id(), written, full)))


def read(paths: StepPaths) -> SaveFiles | None:
    """The step's record, None when it has none; :class:`CheckpointError` when it is unreadable or malformed."""
    path = paths.save_files
    if not path.exists() and not path.is_symlink():
        return None
    doc = read_json_file(path)
    try:
        if not isinstance(doc, dict) or doc.get("schema") not in READABLE:
            raise ValueError(f"not a schema-{' or '.join(map(str, READABLE))} record")
        save_id, listed = doc["save_id"], doc["files"]
        if not isinstance(save_id, str) or not isinstance(listed, dict):
            raise ValueError("save_id or files of the wrong type")
        files = {}
        for rel, entry in listed.items():
            size, sampled = entry["size"], "sampled" in entry
            digest = entry["sampled" if sampled else "blake2b"]
            if type(size) is not int or size < 0 or not isinstance(digest, str):
                raise ValueError(f"entry {rel!r} is not a size and a digest")
            if not isinstance(rel, str) or rel.startswith("/") or ".." in rel.split("/"):
                raise ValueError(f"entry {rel!r} is not a path inside the step")
            content = entry.get("content")
            if content is not None and not isinstance(content, dict):
                raise ValueError(f"entry {rel!r}: content is not a JSON object")
            files[rel] = RecordedFile(size, digest, sampled, *_full(entry, size), content=content)
        copied = doc.get(PUBLISHED_COPY) or {}
        if not isinstance(copied, dict) or not all(isinstance(v, list) for v in copied.values()):
            raise ValueError(f"{PUBLISHED_COPY} is not a list of fields per file")
        published = {str(rel): tuple(map(str, fields)) for rel, fields in copied.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{path}: not a record of a save's files ({e})") from None
    return SaveFiles(save_id, files, published)


def published_copy(paths: StepPaths, replaced: dict[str, tuple[bytes, Any, tuple[str, ...]]]) -> bytes:
    """The record of ``paths`` as a push publishes it, for files published as rewritten copies.

    ``replaced``: by path relative to the step, the published bytes, their parsed content and the
    fields rewritten. Their entries are recomputed over the published bytes (the kept content
    of ``train_config.json`` too, so no local path survives in the record) and listed under
    ``"published_copy"``; every other entry and the save id stay the save's. The local record
    is read, never written.
    """
    doc: dict[str, Any] = read_json_file(paths.save_files, want_object=True)
    full = doc.get("schema") != 1 and full_digest.enabled()
    for rel, (data, content, _fields) in replaced.items():
        entry = _entry_of_bytes(data, full)
        if rel == KEPT_CONTENT and len(data) <= CONTENT_LIMIT and isinstance(content, dict):
            entry["content"] = content
        doc["files"][rel] = entry
    doc[PUBLISHED_COPY] = {rel: list(fields) for rel, (_d, _c, fields) in sorted(replaced.items())}
    return encode(doc)


def _entry_of_bytes(data: bytes, full: bool) -> dict[str, Any]:
    """:func:`_entry` of a file that is these bytes (a small JSON copy held in memory)."""
    sampled = len(data) > DIGEST_LIMIT
    h = hashlib.blake2b(digest_size=16)
    if sampled:
        h.update(data[:SAMPLE])
        h.update(data[max(0, len(data) - SAMPLE) :])
    else:
        h.update(data)
    entry: dict[str, Any] = {"size": len(data), "sampled" if sampled else "blake2b": h.hexdigest()}
    if full:
        entry[FULL] = full_digest.of_bytes(data)
    return entry


def _full(entry: dict[str, Any], size: int) -> tuple[str | None, tuple[Piece, ...]]:
    """A schema-2 entry's full digest, or its pieces (which must tile the file); schema 1: neither."""
    full, listed = entry.get(FULL), entry.get(PIECES)
    if full is not None and not isinstance(full, str):
        raise ValueError(f"{FULL} {full!r} is not a digest")
    if listed is None:
        return full, ()
    if not isinstance(listed, list):
        raise ValueError(f"{PIECES} is not a list")
    pieces, position = [], 0
    for piece in listed:
        offset, length, hexdigest = piece
        if type(offset) is not int or type(length) is not int or offset != position or length <= 0:
            raise ValueError(f"{PIECES}: {piece!r} does not continue at byte {position}")
        if not isinstance(hexdigest, str):
            raise ValueError(f"{PIECES}: {piece!r} has no digest")
        pieces.append((offset, length, hexdigest))
        position += length
    if position != size:
        raise ValueError(f"{PIECES} cover {position} bytes of {size}")
    return full, tuple(pieces)


ALL = (0, 1)  # a bulk_share that samples every bulk file


def edits(paths: StepPaths, saved: SaveFiles) -> list[str]:
    """The user-editable configs changed since the save (reported, never refused)."""
    return [rel for rel in sorted(EDITABLE) if rel in saved.files and differs(paths, rel, saved.files[rel], True)]


def config_edit(paths: StepPaths) -> str | None:
    """The warning for a ``train_config.json`` edited since the save in a way that changes the run
    (:func:`ckpt_tools.format.rules.config_edits.warning`); None without a record that kept it."""
    from ckpt_tools.format.rules import config_edits

    try:
        saved = read(paths)
        kept = saved.files.get(KEPT_CONTENT) if saved is not None else None
        if kept is None or kept.content is None:
            return None
        now = read_json_file(paths.root / KEPT_CONTENT, want_object=True)
    except (CkptError, OSError, ValueError):
        return None  # the record's or the config's own check says why
    return config_edits.warning(kept.content, now)


def amend(paths: StepPaths, written: list[Path]) -> None:
    """Record ``written`` (files a tool of this project just wrote into the step) as the step's own.

    A step without a record stays without one; the save id is kept. A record that cannot be
    read is left as it is (the step's checks report it): the tool's own output stands.
    """
    try:
        if read(paths) is None:
            return
        doc = json.loads(paths.save_files.read_text())
    except (CheckpointError, OSError, ValueError):
        return
    for path in written:
        doc["files"][path.relative_to(paths.root).as_posix()] = _entry(path, None, full=doc.get("schema") != 1)
    with atomic_write(paths.save_files) as handle:
        handle.write(encode(doc))


def differs(
    paths: StepPaths,
    rel: str,
    recorded: RecordedFile,
    digest: bool,
    stamp_problem: Callable[[Path], str | None] | None = None,
) -> list[str]:
    """One line when the file ``rel`` is not what was recorded (nothing when it is, or is gone);
    ``digest``: compare the content too, not only the size, and then first ``stamp_problem``'s line
    for the file's stamp (:func:`ckpt_tools.facts.save_files.problems` reads the stamps)."""
    path = paths.root / rel
    try:
        st = path.lstat()
    except FileNotFoundError:
        return []  # a missing part is the manifest's concern; a deleted converted-away shard is fine
    except OSError as e:
        return [f"{rel}: cannot be read ({e.strerror})"]
    if not stat.S_ISREG(st.st_mode):
        return [f"{rel}: no longer a regular file"]
    if digest and stamp_problem is not None:  # first: "from save X" says more than "another size"
        line = stamp_problem(path)
        if line is not None:
            return [line]
    if st.st_size != recorded.size:
        return [f"{rel}: {st.st_size} bytes, the save wrote {recorded.size}"]
    if digest and _digest(path, st.st_size, recorded.sampled) != recorded.blake2b:
        return [f"{rel}: its content is not what the save wrote (digest differs)"]
    return []


def summary(paths: StepPaths, found: list[str]) -> str:
    """The one line the resume refuses with and the tools fail their check with."""
    shown = "; ".join(found[:LISTED]) + (f"; and {len(found) - LISTED} more" if len(found) > LISTED else "")
    return f"{paths.root}: files that are not from the save that wrote this step ({shown})"


def describe(saved: SaveFiles | None, paths: StepPaths | None = None) -> str:
    """The record in one line; ``paths`` on the Hub: bulk files were compared by size only (see :func:`problems`)."""
    if saved is None:
        return "no record of the save's files (not written by ckpt-train): only the counters tie its files together"
    bulk = sum(f.sampled for f in saved.files.values())
    on_hub = paths is not None and remote_file(paths.root) is not None
    ends = "size (on the Hub: their ends are not downloaded)" if on_hub else "size and both ends"
    full = sum(f.verifiable for f in saved.files.values())
    every_byte = (
        "every byte digested (inspect --verify-data)"
        if full == len(saved.files)
        else f"{full} with a digest of every byte"
        if full
        else "no digest of every byte (an older record)"
    )
    copied = (
        "; published with local paths set to null in " + ", ".join(sorted(saved.published_copy))
        if saved.published_copy
        else ""
    )
    return (
        f"{len(saved.files)} files as save {saved.save_id[:12]} wrote them"
        f" ({len(saved.files) - bulk} by their whole content, {bulk} bulk files by {ends}; {every_byte})" + copied
    )


def _entry(path: Path, written: dict[str, Any] | None, full: bool = True) -> dict[str, Any]:
    """One file's line of the record: its size, its digest (whole or of both ends) and, ``full``,
    the full digest of its bytes - the writers' (``written``) when they computed one for this size."""
    size = path.stat().st_size
    sampled = _bulk(path, size)
    entry: dict[str, Any] = {"size": size, "sampled" if sampled else "blake2b": _digest(path, size, sampled)}
    if not full or not full_digest.enabled():
        return entry
    if written is not None and written.get("size") == size and ("whole" in written or "pieces" in written):
        if "whole" in written:
            entry[FULL] = written["whole"]
        else:
            entry[PIECES] = [list(p) for p in written["pieces"]]
    else:
        entry[FULL] = full_digest.of_file(path)[1]
    return entry


def _files_under(root: Path) -> list[Path]:
    out = []
    for dirpath, _dirnames, filenames in os.walk(root):
        out += [Path(dirpath) / name for name in filenames]
    return out


def _bulk(path: Path, size: int) -> bool:
    return size > DIGEST_LIMIT or path.name.endswith(L.DCP_SHARD_SUFFIX)


def _digest(path: Path, size: int, sampled: bool) -> str:
    """BLAKE2b of the whole file, or (``sampled``) of its first and last :data:`SAMPLE` bytes.

    ``size`` is what the caller saw; a whole-file digest reads at most :data:`DIGEST_LIMIT` + 1
    bytes, so a record cannot make a check read a huge file end to end.
    """
    remote = remote_file(path)
    fd: int | RemoteHandle = RemoteHandle(remote) if remote is not None else open_regular(path)  # Hub: by ranges
    try:
        h = hashlib.blake2b(digest_size=16)
        if sampled:
            h.update(pread(fd, SAMPLE, 0))
            h.update(pread(fd, SAMPLE, max(0, size - SAMPLE)))
        else:
            done = 0
            while done <= DIGEST_LIMIT and (chunk := pread(fd, min(_READ, DIGEST_LIMIT + 1 - done), done)):
                h.update(chunk)
                done += len(chunk)
        return h.hexdigest()
    finally:
        if isinstance(fd, int):
            os.close(fd)


def encode(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
