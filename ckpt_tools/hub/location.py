"""The one spelling of a checkpoint on the Hugging Face Hub: ``hf://OWNER/REPO[@REVISION][/PATH/IN/REPO]``.

Every tool that takes a checkpoint path takes this too (and ``ckpt-train`` its resume source);
all of them parse it here. It is huggingface_hub's own ``HfFileSystem`` spelling, so a path a
user copied from there works: a revision holding ``/`` (``refs/pr/1``) is written URL-encoded
(``@refs%2Fpr%2F1``). Only model repositories hold checkpoints: ``hf://datasets/...`` and
``hf://spaces/...`` are refused with one line, as is anything that is not a repo id. A string
that does not start with ``hf://`` is a local path and never comes here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

from ckpt_tools.errors import UsageError

SCHEME = "hf://"
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_REPO_ID_RE = re.compile(rf"^{_NAME}/{_NAME}$")
_NOT_MODELS = ("datasets", "spaces")
_REVISION_RE = re.compile(r"^[^\s~^:?*\[\\]+$")  # what git accepts in a ref name, roughly; no spaces or wildcards


@dataclass(frozen=True)
class HubLocation:
    """A path inside one revision of a Hub model repository."""

    repo_id: str
    revision: str | None  # None: the default branch
    path: str  # inside the repo, no leading or trailing "/"; "" is the repo's root

    @property
    def url(self) -> str:
        """The ``hf://`` spelling of this location (revision URL-encoded), as messages show it."""
        rev = f"@{quote(self.revision, safe='')}" if self.revision else ""
        return f"{SCHEME}{self.repo_id}{rev}" + (f"/{self.path}" if self.path else "")

    def child(self, relative: str) -> HubLocation:
        """The location of ``relative`` (a ``/``-separated path) below this one."""
        joined = "/".join(p for p in (self.path, relative.strip("/")) if p)
        return HubLocation(self.repo_id, self.revision, joined)

    def __str__(self) -> str:
        return self.url


def is_hub_path(text: object) -> bool:
    """Whether a command-line path names the Hub (``hf://...``) rather than a local file."""
    return isinstance(text, str) and text.startswith(SCHEME)


def parse_hub_path(text: str) -> HubLocation:
    """``hf://OWNER/REPO[@REVISION][/PATH]`` as a :class:`HubLocation`; a :class:`UsageError` line if malformed."""
    if not is_hub_path(text):
        raise UsageError(f"{text!r}: not a Hub path (expected hf://OWNER/REPO[@REVISION][/PATH])")
    rest = text[len(SCHEME) :]
    parts = rest.split("/")
    if parts[0] in _NOT_MODELS:
        kind = parts[0][:-1]
        raise UsageError(
            f"{text}: a {kind} repository holds no checkpoint; name a model repository (hf://OWNER/REPO[/PATH])"
        )
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise UsageError(f"{text}: expected hf://OWNER/REPO[@REVISION][/PATH]")
    owner, name_rev, inside = parts[0], parts[1], parts[2:]
    name, at, encoded = name_rev.partition("@")
    repo_id = f"{owner}/{name}"
    if not _REPO_ID_RE.match(repo_id) or ".." in repo_id or "--" in repo_id:
        raise UsageError(
            f"{text}: {repo_id!r} is not a Hub repo id (expected OWNER/REPO: letters, digits, '-', '_', '.')"
        )
    revision = unquote(encoded) if at else None
    if at and (not revision or not _REVISION_RE.match(revision) or ".." in revision):
        raise UsageError(f"{text}: {encoded!r} is not a revision (a branch, tag or commit; '/' written as %2F)")
    if any(p in (".", "..") for p in inside):
        raise UsageError(f"{text}: '.' and '..' are not allowed in a Hub path")
    return HubLocation(repo_id, revision, "/".join(p for p in inside if p))
