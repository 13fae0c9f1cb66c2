"""Each rank's full digests of what it wrote into a save, handed to the commit through the partial dir.

The full digest of a file (:mod:`ckpt_tools.io.digest`) is computed where its bytes are
written: in the DCP writer threads of every rank (one digest per shard file), and by every
rank that ``pwrite``s its rows of the gathered ``model.safetensors`` (one digest per written
range: the ranges of one file come from many ranks, and a digest of a whole cannot be put
together from digests of its parts). No collective carries them: before the save's closing
barrier each rank dumps its own into ``.save_digests/rank-NNNNN.json`` inside the partial
directory - the shared directory the shards themselves go to - and the commit, after the
barrier, merges them (:func:`merged`) and removes the folder before it records the files.
A file that no writer reported (the main rank's small side files, DCP's ``.metadata``) or
whose ranges do not tile it exactly is digested by the commit from the page cache.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from ckpt_tools.io import digest

DIR = ".save_digests"


class WrittenDigests:
    """One rank's digests for one save (thread-safe: DCP's writer threads report into it)."""

    def __init__(self, root: Path) -> None:
        self.root = root  # the partial step directory; paths are recorded relative to it
        self.enabled = digest.enabled()
        self._lock = threading.Lock()
        self._whole: dict[str, list[Any]] = {}
        self._pieces: dict[str, list[list[Any]]] = {}
        self.seconds = 0.0  # spent computing the digests (summed over threads; bin/bench-save reports it)

    def whole(self, path: str | os.PathLike[str], size: int, hexdigest: str, seconds: float = 0.0) -> None:
        rel = self._rel(path)
        with self._lock:
            self.seconds += seconds
            if rel is not None:
                self._whole[rel] = [size, hexdigest]

    def piece(
        self, path: str | os.PathLike[str], offset: int, length: int, hexdigest: str, seconds: float = 0.0
    ) -> None:
        rel = self._rel(path)
        with self._lock:
            self.seconds += seconds
            if rel is not None and length > 0:
                self._pieces.setdefault(rel, []).append([offset, length, hexdigest])

    def dump(self, rank: int) -> None:
        """Write this rank's digests where the commit finds them (nothing when digests are off)."""
        if not self.enabled:
            return
        folder = self.root / DIR
        folder.mkdir(exist_ok=True)
        with self._lock:
            doc = {"whole": self._whole, "pieces": self._pieces}
        (folder / f"rank-{rank:05d}.json").write_text(json.dumps(doc))

    def _rel(self, path: str | os.PathLike[str]) -> str | None:
        try:
            return Path(path).relative_to(self.root).as_posix()
        except ValueError:
            return None  # not under this save's directory: the commit digests what it finds instead


def merged(root: Path) -> dict[str, dict[str, Any]]:
    """Commit, after every rank dumped: the digests per file (relative path -> ``{"size", "whole"|"pieces"}``).

    The folder is removed. Pieces of one file are kept only when they tile it exactly, in
    offset order; a single piece covering the file becomes its whole digest.
    """
    folder = root / DIR
    whole: dict[str, dict[str, Any]] = {}
    pieces: dict[str, list[tuple[int, int, str]]] = {}
    if folder.is_dir():
        for part in sorted(folder.glob("rank-*.json")):
            doc = json.loads(part.read_text())
            for rel, (size, hexdigest) in doc["whole"].items():
                whole[rel] = {"size": size, "whole": hexdigest}
            for rel, found in doc["pieces"].items():
                pieces.setdefault(rel, []).extend((int(o), int(n), str(d)) for o, n, d in found)
        shutil.rmtree(folder)
    for rel, found in pieces.items():
        found.sort()
        size = (root / rel).stat().st_size if (root / rel).is_file() else -1
        if not _tiles(found, size):
            continue  # the commit digests the file itself
        whole[rel] = {"size": size, "whole": found[0][2]} if len(found) == 1 else {"size": size, "pieces": found}
    return whole


def _tiles(pieces: list[tuple[int, int, str]], size: int) -> bool:
    position = 0
    for offset, length, _ in pieces:
        if offset != position:
            return False
        position += length
    return position == size
