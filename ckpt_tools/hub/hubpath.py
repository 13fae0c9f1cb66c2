"""A path inside a Hub repository that the tools' readers take where they take a local path.

Why a ``Path``: the layout's resolution rules (:mod:`ckpt_tools.format.layout`), the checks of
``inspect``, ``reshard-plan`` and ``verify-resume`` all walk a checkpoint with ``exists``,
``is_dir``, ``glob`` and ``/``. A :class:`HubPath` answers those from the repository's
listing (:class:`~ckpt_tools.hub.remote.HubRepo`, fetched once), so the same rules and checks
run unchanged - one home for each - and the readers of file contents see a
:class:`~ckpt_tools.io.remote.RemoteFile` (the seam in :mod:`ckpt_tools.io.remote`) and read
only the byte ranges they need. Its ``os.fspath`` is its ``hf://`` spelling, which names no
local file: a reader that went to the local file system by mistake fails, it never reads
something else. There are no symlinks on the Hub (an uploaded ``last`` is a folder).
"""

from __future__ import annotations

import fnmatch
import os
import stat as stat_module
from collections.abc import Generator, Iterator
from pathlib import PosixPath
from typing import Any, ClassVar

from ckpt_tools.hub.location import HubLocation
from ckpt_tools.hub.remote import HubRepo

# The first part of every HubPath. Should a caller turn one into a plain ``Path`` (``Path(p)``
# keeps the parts, not the class), the result names no local file, and any file system call on
# it fails at once (a path holding a NUL byte is refused by the kernel's interface).
ANCHOR = "\x00hf"


class HubPath(PosixPath):
    """An absolute path ``/<ANCHOR>/<path in repo>`` bound (by its class) to one listed :class:`HubRepo`."""

    _repo: ClassVar[HubRepo]

    @classmethod
    def bound_to(cls, repo: HubRepo) -> type[HubPath]:
        """A subclass whose paths live in ``repo``: every path derived from one (``/``, ``parent``) stays in it."""
        return type("HubPath", (cls,), {"_repo": repo})

    @classmethod
    def of(cls, repo: HubRepo) -> HubPath:
        """The path the repo's location names (``hf://OWNER/REPO/PATH`` -> ``/<ANCHOR>/PATH``)."""
        return cls.bound_to(repo)("/", ANCHOR, *filter(None, repo.location.path.split("/")))

    # ---------------------------------------------------------------- naming

    @property
    def in_repo(self) -> str:
        """The path inside the repository, without a leading ``/`` ("" for its root)."""
        return "/".join(self.parts[2:])

    @property
    def location(self) -> HubLocation:
        loc = self._repo.location
        return HubLocation(loc.repo_id, loc.revision, self.in_repo)

    def __str__(self) -> str:
        if self.parts[:2] != ("/", ANCHOR):  # a relative path (``relative_to``): a plain one
            return PosixPath.__str__(self)
        return self.location.url

    def __fspath__(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"HubPath({self.location.url!r})"

    # ---------------------------------------------------------------- what the listing says

    def exists(self, *, follow_symlinks: bool = True) -> bool:  # type: ignore[override]
        return self.in_repo in self._repo.files or self.in_repo in self._repo.dirs

    def is_file(self) -> bool:
        return self.in_repo in self._repo.files

    def is_dir(self) -> bool:
        return self.in_repo in self._repo.dirs

    def is_symlink(self) -> bool:
        return False

    def is_fifo(self) -> bool:
        return False

    def resolve(self, strict: bool = False) -> HubPath:
        return self

    def absolute(self) -> HubPath:
        return self

    def expanduser(self) -> HubPath:
        return self

    def readlink(self) -> HubPath:
        raise OSError(22, "not a symbolic link (the Hub has none)", str(self))

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:  # type: ignore[override]
        if self.is_file():
            mode, size = stat_module.S_IFREG | 0o444, self._repo.files[self.in_repo].size
        elif self.is_dir():
            mode, size = stat_module.S_IFDIR | 0o555, 0
        else:
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return os.stat_result((mode, 0, 0, 1, 0, 0, size, 0, 0, 0))

    def lstat(self) -> os.stat_result:
        return self.stat()

    def iterdir(self) -> Generator[HubPath, None, None]:
        if not self.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(self))
        for name in sorted(self.remote_children()):
            yield self / name

    def glob(self, pattern: str) -> Iterator[HubPath]:  # type: ignore[override]
        """The direct children matching ``pattern`` (the layout only globs one level: ``*.safetensors``)."""
        if "/" in pattern or "**" in pattern:
            raise ValueError(f"{self}: only one-level patterns are read on the Hub, not {pattern!r}")
        if not self.is_dir():
            return iter(())
        return iter([self / n for n in sorted(self.remote_children()) if fnmatch.fnmatchcase(n, pattern)])

    # ---------------------------------------------------------------- ckpt_tools.io.remote.RemoteFile

    def remote_size(self) -> int:
        entry = self._repo.files.get(self.in_repo)
        if entry is None:
            if self.is_dir():
                raise IsADirectoryError(21, "Is a directory", str(self))
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return entry.size

    def remote_read(self, offset: int, length: int) -> bytes:
        return self._repo.read(self.in_repo, offset, length)

    def remote_children(self) -> dict[str, int | None]:
        prefix = f"{self.in_repo}/" if self.in_repo else ""
        out: dict[str, int | None] = {}
        for path, entry in self._repo.files.items():
            if path.startswith(prefix):
                name, sep, _ = path[len(prefix) :].partition("/")
                out[name] = None if sep else entry.size
        return out

    # ---------------------------------------------------------------- whole small files

    def read_bytes(self) -> bytes:
        from ckpt_tools.io.remote import read_remote_whole
        from ckpt_tools.io.safe_read import MAX_JSON_BYTES

        return read_remote_whole(self, MAX_JSON_BYTES, str(self))

    def read_text(self, encoding: str | None = None, errors: str | None = None) -> str:
        return self.read_bytes().decode(encoding or "utf-8", errors or "strict")

    def open(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise OSError(95, "a file on the Hub is read by ranges, not opened", str(self))
