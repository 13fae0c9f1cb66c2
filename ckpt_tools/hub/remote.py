"""A Hub repository as the tools read it: one listing, then ranged reads of only the bytes asked for.

Why: a checkpoint on the Hub is gigabytes of shards, and ``inspect`` needs a few kilobytes
of them - the ``.metadata``, the JSON records, each safetensors header. So the repository is
listed once (``HfApi.list_repo_tree``, recursive: every file's path and size), and each read
is an HTTP ``Range`` GET of the file's ``resolve`` URL through huggingface_hub's own session
(its token, endpoint and headers). Nothing is written locally: no cache entry, no partial or
sparse copy a later reader could mistake for the file.

Every request goes through the bounded client of a push (:mod:`ckpt_tools.hub.client`: a
deadline per request, a cap per answer), and every failure becomes one line: the repository
or revision not found (or not readable with this token), a file that is not there, the
network down, an answer that is not what was asked for.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ckpt_tools.errors import CheckpointError, CkptError, ExitCode
from ckpt_tools.format.layout import DCP_SHARD_SUFFIX
from ckpt_tools.hub.client import DeadlineExceeded, ResponseTooLarge
from ckpt_tools.hub.location import HubLocation

MAX_RANGE_BYTES = 256 * 2**20  # what one ranged read may ask for: a streamed chunk, never a whole shard
# A file this small is fetched whole at its first read and kept: the JSON records, .metadata and
# small headers are read several times by different checks; a revision's files never change.
SMALL_FILE_BYTES = 256 * 1024
KEPT_BYTES = 64 * 2**20  # at most this much of small files is kept


class HubReadError(CkptError):
    """The Hub (or the network to it) failed a read: one line, exit 5 like a failed push."""

    exit_code = ExitCode.HUB_FAILED


@dataclass(frozen=True)
class RemoteEntry:
    """One file of the listing."""

    path: str  # in the repo
    size: int
    sha256: str | None  # LFS files: the content's sha256, as the Hub stores it


class HubRepo:
    """One revision of one repository: its listing, and ranged reads of its files."""

    def __init__(self, location: HubLocation, files: dict[str, RemoteEntry], commit: str | None) -> None:
        self.location = location
        self.files = files
        self.commit = commit  # the revision resolved to a commit, so every read sees the same files
        self.dirs = {"/".join(p.split("/")[:i]) for p in files for i in range(len(p.split("/")))}
        self._lock = threading.Lock()
        self.bytes_read = 0
        self._kept: dict[str, bytes] = {}
        self._kept_bytes = 0

    @classmethod
    def open(cls, location: HubLocation) -> HubRepo:
        """List ``location``'s repository at its revision (one request per page of the listing)."""
        from huggingface_hub import HfApi

        api = HfApi()
        with hub_errors(location, "listing the repository"):
            info = api.model_info(location.repo_id, revision=location.revision)
            commit = getattr(info, "sha", None)
            files: dict[str, RemoteEntry] = {}
            for item in api.list_repo_tree(location.repo_id, recursive=True, revision=commit or location.revision):
                size = getattr(item, "size", None)
                if size is None or not hasattr(item, "blob_id"):
                    continue  # a folder
                lfs = getattr(item, "lfs", None)
                sha = getattr(lfs, "sha256", None) if lfs is not None else None
                files[item.path] = RemoteEntry(item.path, int(size), sha)
        repo = cls(location, files, commit)
        if location.path and location.path not in files and location.path not in repo.dirs:
            raise CheckpointError(f"{location}: no such file or directory in {location.repo_id}")
        return repo

    def read(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``path`` at ``offset`` (fewer only at the end of the file), by one ranged GET."""
        entry = self.files.get(path)
        if entry is None:
            raise FileNotFoundError(2, "No such file or directory", path)
        length = max(0, min(length, entry.size - offset))
        if length == 0:
            return b""
        if entry.size <= SMALL_FILE_BYTES and not path.endswith(DCP_SHARD_SUFFIX):  # shards: only the ranges asked for
            return self._small(entry)[offset : offset + length]
        return self._get(entry, offset, length)

    def _small(self, entry: RemoteEntry) -> bytes:
        """A small file, whole: from what was kept, or by one read that is then kept (within :data:`KEPT_BYTES`)."""
        with self._lock:
            kept = self._kept.get(entry.path)
        if kept is not None:
            return kept
        data = self._get(entry, 0, entry.size)
        with self._lock:
            if self._kept_bytes + len(data) <= KEPT_BYTES:
                self._kept[entry.path] = data
                self._kept_bytes += len(data)
        return data

    def _get(self, entry: RemoteEntry, offset: int, length: int) -> bytes:
        """One ranged GET of ``length`` bytes at ``offset`` (checked: exactly those bytes came back)."""
        path = entry.path
        if length > MAX_RANGE_BYTES:
            raise CheckpointError(f"{self.location.child(path)}: a read of {length} bytes, more than one range holds")
        from huggingface_hub import get_session, hf_hub_url
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

        url = hf_hub_url(self.location.repo_id, path, revision=self.commit or self.location.revision)
        headers = {
            **build_hf_headers(),
            "Range": f"bytes={offset}-{offset + length - 1}",
            "Accept-Encoding": "identity",
        }
        where = self.location.child(path)
        with hub_errors(where, "reading a file"):
            response = get_session().get(url, headers=headers, follow_redirects=True)
            hf_raise_for_status(response)
            data = response.content
        if response.status_code != 206 and not (offset == 0 and len(data) == entry.size):
            raise HubReadError(
                f"{where}: the Hub did not answer the byte range asked for (HTTP {response.status_code})"
            )
        if response.status_code == 206:
            if len(data) != length:
                raise HubReadError(f"{where}: asked for {length} bytes at {offset}, got {len(data)}")
        else:
            data = data[offset : offset + length]
        with self._lock:
            self.bytes_read += len(data)
        return data


@contextlib.contextmanager
def hub_errors(where: HubLocation, doing: str) -> Iterator[None]:
    """Anything huggingface_hub or the network raises while ``doing`` as one :class:`CkptError` line."""
    try:
        yield
    except CkptError:
        raise
    except Exception as e:
        raise describe(e, where, doing) from None


def describe(error: Exception, where: HubLocation, doing: str) -> CkptError:
    """The one line for a failed Hub read; missing things are bad input (3), the Hub's failures exit 5."""
    names = {cls.__name__ for cls in type(error).__mro__}
    status = getattr(getattr(error, "response", None), "status_code", None)
    repo = where.repo_id
    if "RevisionNotFoundError" in names:
        return CheckpointError(f"{where}: revision {where.revision!r} not found in {repo}")
    if "RepositoryNotFoundError" in names or (status in (401, 403) and "EntryNotFoundError" not in names):
        hint = "" if status == 404 else " (set HF_TOKEN or run `hf auth login` if it is private)"
        return CheckpointError(f"{where}: repository {repo} not found, or not readable with this token{hint}")
    if "EntryNotFoundError" in names or status == 404:
        return CheckpointError(f"{where}: no such file in {repo}")
    if "OfflineModeIsEnabled" in names:
        return HubReadError(f"{where}: HF_HUB_OFFLINE is set, so nothing can be read from the Hub (unset it)")
    if isinstance(error, DeadlineExceeded):
        return HubReadError(f"{where}: no complete answer from the Hub within {error.seconds:g} s ({doing})")
    if isinstance(error, ResponseTooLarge):
        return HubReadError(f"{where}: the Hub's answer was larger than any reply should be ({doing}); refused")
    if isinstance(status, int):
        return HubReadError(f"{where}: HTTP {status} from the Hub ({doing})")
    detail = _first_line(error)
    return HubReadError(f"{where}: network error talking to the Hub ({doing}: {type(error).__name__}: {detail})")


def _first_line(value: Any) -> str:
    text = str(value).strip()
    return (text.splitlines()[0] if text else "")[:200]
