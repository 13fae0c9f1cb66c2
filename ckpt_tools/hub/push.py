"""Upload a checked folder as a Hub model repo, with ``huggingface_hub`` doing the protocol.

One push is: create the repo (``exist_ok``), create the branch when ``revision`` names one,
then one ``create_commit`` holding the planned files plus the generated card. The commit is
atomic on the Hub side: a failure anywhere before it (pre-upload, LFS upload) leaves the
repo as it was, and a retry re-sends only what the Hub does not already hold.

Why the HTTP client is bounded here: ``huggingface_hub`` builds its shared client with no
timeout and reads every answer whole, so a server that never answers, trickles one byte at a
time, or answers with gigabytes would hang a push - and the end of a training job - or
exhaust its memory. During a push we install a client factory (the public
``huggingface_hub.set_client_factory``) whose client (:mod:`ckpt_tools.hub.client`) gives
each read, write and connect ``CKPT_TOOLS_HUB_TIMEOUT`` seconds (default 120; connect at most
10 s), each whole request ``CKPT_TOOLS_HUB_DEADLINE`` seconds (default 300) plus the time
its upload needs at 256 KiB/s, and each answer at most 16 MiB; the previous factory is
restored afterwards. A factory the caller installed themselves is left alone: its bounds
are theirs. The library also retries LFS uploads, pre-upload and LFS batch calls on
5xx/429/timeouts (5 tries, 1-8 s back-off); create_repo and the commit call are not retried,
nor is a request past its deadline (a server that trickled once would trickle again).

What a failure says: a failure of the Hub or of the network to it is a
:class:`HubPushError` (exit 5) that names the step, the cause and what was (not) published;
callers that know more - the conversion that just wrote files, the command that retries -
rebuild its line with :meth:`HubPushError.but`. A failure that is ours - a file that cannot
be read, a name or message that is not UTF-8, a full local disk - is never reported as the
Hub's: it is a :class:`~ckpt_tools.errors.CheckpointError` (exit 3) or a
:class:`~ckpt_tools.errors.WriteError` (exit 4) saying it is local, and those that can be
seen before any request (names, messages, the card) are refused before the first one.

Tokens: ``token=None`` lets the client resolve ``HF_TOKEN`` or the token file under
``HF_HOME``; the resolved value is only used to mask it out of every message we raise and
to refuse publishing a file that contains it. It is never printed or logged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ckpt_tools.errors import CheckpointError, CkptError, HubError, UsageError, WriteError, shown
from ckpt_tools.hub.card import build_model_card
from ckpt_tools.hub.client import Bounds, DeadlineExceeded, MiB, ResponseTooLarge
from ckpt_tools.hub.files import (
    README,
    WEIGHTS,
    WHOLE_RUN,
    WHOLE_STEP,
    PublishPlan,
    plan_publish,
    resolve_publish_folder,
)
from ckpt_tools.hub.local_paths import with_published_copies
from ckpt_tools.units import human_bytes

TIMEOUT_ENV = "CKPT_TOOLS_HUB_TIMEOUT"
DEFAULT_TIMEOUT_S = 120.0
DEADLINE_ENV = "CKPT_TOOLS_HUB_DEADLINE"
DEFAULT_DEADLINE_S = 300.0
MAX_RESPONSE_BYTES = 16 * MiB  # no Hub API reply a push reads comes near it
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
_FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


class HubPushError(HubError):
    """A push that failed on the Hub's side or the network's (exit 5), as the parts of its one line.

    ``failure``: "Hub push to REPO failed (STEP): CAUSE"; ``outcome``: what the Hub holds now
    ("nothing was published", or that the commit may have landed); ``local``: what happened to
    local files; ``retry``: how to retry - "retry with: COMMAND" when the caller knows the
    command, else "a retry is safe". ``folder`` is the folder the push was sending.
    """

    def __init__(
        self,
        failure: str,
        outcome: str,
        local: str = "no local file was changed",
        retry: str = "a retry is safe",
        folder: Path | None = None,
    ) -> None:
        self.failure, self.outcome, self.local, self.retry, self.folder = failure, outcome, local, retry, folder
        super().__init__(f"{failure}; {outcome}; {local}; {retry}")

    def but(self, *, local: str | None = None, retry: str | None = None, folder: Path | None = None) -> HubPushError:
        """The same failure, told by a caller that knows what happened locally or how to retry."""
        return HubPushError(
            self.failure,
            self.outcome,
            self.local if local is None else local,
            self.retry if retry is None else retry,
            self.folder if folder is None else folder,
        )


@dataclass(frozen=True)
class UploadedFile:
    """One file of the commit: its path in the repo, size and sha256 of the bytes sent."""

    path: str
    size: int
    sha256: str
    generated: bool = False  # True for the model card built by ckpt-tools


@dataclass(frozen=True)
class PushResult:
    """What a push published, where, and what it deliberately left out."""

    repo_id: str
    repo_url: str
    revision: str
    commit_oid: str
    commit_url: str
    private: bool  # as requested; a private push to an existing public repo is refused
    files: tuple[UploadedFile, ...]
    skipped: tuple[str, ...]  # top-level entries of the folder that were not uploaded
    card: str  # "generated", "user" (the folder's README.md) or "none"
    rewritten: tuple[str, ...] = ()  # files published as copies without local paths (hub.local_paths)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["total_bytes"] = self.total_bytes
        return out


def push_to_hub(
    folder: str | os.PathLike[str],
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
    model_card: bool = True,
    endpoint: str | None = None,
    scope: str = WEIGHTS,
) -> PushResult:
    """Publish a converted ``pretrained_model/`` (or a step dir, or a convert output dir) as a model repo.

    ``scope`` WEIGHTS (the default) uploads only the model folder's top-level ``*.safetensors``,
    ``*.json`` and ``*.md`` files; WHOLE_STEP the step as the trainer wrote it, under
    ``checkpoints/<step>/``; WHOLE_RUN every complete step and ``checkpoints/last``
    (:mod:`ckpt_tools.hub.whole_step`). JSON files holding local absolute paths are published
    as copies with those paths set to null (:mod:`ckpt_tools.hub.local_paths`). A generated
    ``README.md`` model card is added unless the folder has its own or ``model_card`` is
    False. ``private`` applies to a repo this call creates; pushing with ``private=True`` to an
    existing public repo is refused rather than silently publishing. ``revision`` names a
    branch (created from main when missing). Raises :class:`HubPushError` (exit code 5) for any
    network or server failure - no local file is changed by a push - and a
    :class:`~ckpt_tools.errors.CkptError` of exit code 2, 3 or 4 for a local one.
    """
    upload = prepare_push(
        folder,
        repo_id,
        revision=revision,
        commit_message=commit_message,
        token=token,
        model_card=model_card,
        scope=scope,
    )
    with _bounded_client(push_bounds()):
        try:
            return _push(upload, private, revision, token, endpoint)
        except HubPushError as e:
            raise e.but(folder=upload.plan.folder) from None


def push_bounds() -> Bounds:
    """The limits of each request of a push, from ``CKPT_TOOLS_HUB_TIMEOUT`` / ``CKPT_TOOLS_HUB_DEADLINE``."""
    return Bounds(
        _seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT_S), _seconds(DEADLINE_ENV, DEFAULT_DEADLINE_S), MAX_RESPONSE_BYTES
    )


@dataclass(frozen=True)
class PreparedPush:
    """Everything a push sends, decided and checked locally: what runs before any network call."""

    plan: PublishPlan
    repo_id: str
    card: str | None  # the generated model card; None: the folder's own README.md, or none
    message: str
    secrets: tuple[str, ...]  # tokens to mask out of every message


def prepare_push(
    folder: str | os.PathLike[str],
    repo_id: str,
    *,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
    model_card: bool = True,
    scope: str = WEIGHTS,
) -> PreparedPush:
    """The reading and validation stage of :func:`push_to_hub`, up to the network.

    Checks the repo id and revision, picks and checks the files (:func:`plan_publish`: JSON
    through the hardened reader, safetensors headers against their sizes), refuses a file that
    holds the token, and builds the model card. Everything a hostile folder can break breaks
    here, as one :class:`~ckpt_tools.errors.CkptError` line.
    """
    check_repo_id(repo_id)
    if revision is not None and not revision.strip():
        raise UsageError("--revision: must not be empty")
    _refuse_unencodable(revision, "--revision")
    _refuse_unencodable(commit_message, "--commit-message")
    plan = with_published_copies(plan_for(folder, scope))
    for f in plan.files:  # a name the Hub's JSON cannot carry; found here, not as a failure mid-push
        if not _utf8(f.name):
            raise CheckpointError(
                f"{_printable(f.path)}: the file name is not valid UTF-8, so it cannot be a file of a Hub repo"
                " (rename it, or move it out of the folder)"
            )
    secrets = _known_secrets(token)
    plan.refuse_secrets(secrets)
    card = build_model_card(plan, repo_id=repo_id, secrets=secrets) if model_card and not plan.has_readme else None
    if card is not None and not _utf8(card):
        raise CheckpointError(
            f"{plan.folder}: the model card built from its train_config.json would hold text that is not valid"
            " UTF-8 (a lone surrogate escape); fix the value, or push with --no-card"
        )
    return PreparedPush(plan, repo_id, card, commit_message or _default_message(plan), secrets)


def plan_for(folder: str | os.PathLike[str], scope: str) -> PublishPlan:
    """The files a push of ``scope`` publishes from what the user named."""
    from ckpt_tools.hub.whole_step import plan_whole_run, plan_whole_step

    if scope == WHOLE_STEP:
        return plan_whole_step(_existing_dir(folder))
    if scope == WHOLE_RUN:
        return plan_whole_run(_existing_dir(folder))
    if scope != WEIGHTS:
        raise UsageError(f"unknown push scope {scope!r} (expected {WEIGHTS}, {WHOLE_STEP} or {WHOLE_RUN})")
    return plan_publish(resolve_publish_folder(folder))


def _existing_dir(folder: str | os.PathLike[str]) -> Path:
    path = Path(folder).expanduser()
    if not path.exists():
        raise CheckpointError(f"{path}: no such directory")
    if not path.is_dir():
        raise UsageError(f"{path}: PATH must be a directory (a step dir, a checkpoints root or a run dir)")
    return path


def dry_run(upload: PreparedPush) -> dict[str, Any]:
    """What the push would publish, decided without contacting anything: each file's repo path,
    size and source (a local path, a rewritten copy, or generated), and the model card's text."""
    plan = upload.plan
    files = [{"path": f.name, "size": f.size, "source": f.source} for f in plan.files]
    if upload.card is not None:
        files.append({"path": README, "size": len(upload.card.encode("utf-8")), "source": "generated model card"})
    return {
        "repo_id": upload.repo_id,
        "scope": plan.scope,
        "files": files,
        "total_bytes": sum(f["size"] for f in files),
        "skipped": list(plan.skipped),
        # The published copies themselves, as they would be sent (local paths set to null).
        "rewritten": {
            f.name: {
                "fields": list(f.rewritten),
                "change": f.rewrite,
                "content": f.read_published().decode("utf-8") if f.name.endswith(".json") else None,
            }
            for f in plan.rewritten
        },
        "card": upload.card,
        "card_source": "generated" if upload.card is not None else ("user" if plan.has_readme else "none"),
        "commit_message": upload.message,
    }


def _printable(path: object) -> str:
    """A local path for a message, whole (it is ours, not a value read from a file), bytes not UTF-8 escaped."""
    raw = os.fsencode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path).encode("utf-8", "replace")
    return raw.decode("utf-8", "backslashreplace")


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _refuse_unencodable(value: str | None, flag: str) -> None:
    """A value from the command line that is not UTF-8 (undecodable argv bytes) is a usage error, said so."""
    if value is not None and not _utf8(value):
        raise UsageError(
            f"{flag}: not valid UTF-8 ({shown(value.encode('utf-8', 'backslashreplace').decode())}); pass it as UTF-8 text"
        )


def check_repo_id(repo_id: str, flag: str = "--repo-id") -> None:
    """A model repo id is ``namespace/name``; checked locally so a typo never reaches the network.

    ``flag`` names the option in the message (``--push-to-hub``, ``--policy.repo_id``), so
    callers can validate at start-up, before a conversion or a training run.
    """
    if not isinstance(repo_id, str) or not _REPO_ID_RE.match(repo_id) or ".." in repo_id or "--" in repo_id:
        raise UsageError(
            f"{flag}: {repo_id!r} is not a Hub repo id (expected NAMESPACE/NAME: letters, digits, '-', '_', '.')"
        )


def _push(
    upload: PreparedPush, private: bool, revision: str | None, token: str | None, endpoint: str | None
) -> PushResult:
    from huggingface_hub import CommitOperationAdd, HfApi

    plan, repo_id, card, message, secrets = upload.plan, upload.repo_id, upload.card, upload.message, upload.secrets

    api = HfApi(endpoint=endpoint, token=token)
    with _hub_errors(repo_id, "read the local files", api.endpoint, secrets, local=True):
        # Files stream from their paths (bounded memory at any size); only small rewritten copies are bytes.
        ops = [
            CommitOperationAdd(path_in_repo=f.name, path_or_fileobj=f.data if f.data is not None else str(f.path))
            for f in plan.files
        ]
        if card is not None:
            ops.append(CommitOperationAdd(path_in_repo=README, path_or_fileobj=card.encode("utf-8")))
    with _hub_errors(repo_id, "create the repo", api.endpoint, secrets):
        repo_url = api.create_repo(repo_id, repo_type="model", private=True if private else None, exist_ok=True)
    if private:
        with _hub_errors(repo_id, "check the repo's visibility", api.endpoint, secrets):
            is_private = bool(api.model_info(repo_id).private)
        if not is_private:
            raise HubError(
                f"{repo_id} already exists and is public: --private only applies to a new repo;"
                " nothing was uploaded (make the repo private on the Hub, or push without --private)"
            )
    if revision is not None and revision != "main":
        with _hub_errors(repo_id, f"create branch {revision!r}", api.endpoint, secrets):
            api.create_branch(repo_id, branch=revision, exist_ok=True)
    with _hub_errors(repo_id, "upload", api.endpoint, secrets):
        info = api.create_commit(repo_id, ops, commit_message=message, revision=revision)
    uploaded = tuple(
        UploadedFile(
            op.path_in_repo,
            op.upload_info.size,
            op.upload_info.sha256.hex(),
            generated=card is not None and op.path_in_repo == README,
        )
        for op in ops
    )
    return PushResult(
        repo_id=repo_id,
        repo_url=str(repo_url),
        revision=revision or "main",
        commit_oid=str(info.oid),
        commit_url=str(info.commit_url),
        private=private,
        files=uploaded,
        skipped=plan.skipped,
        card="generated" if card is not None else ("user" if plan.has_readme else "none"),
        rewritten=tuple(f.name for f in plan.rewritten),
    )


def _default_message(plan: PublishPlan) -> str:
    if plan.scope == WHOLE_STEP:
        return f"Upload checkpoint {plan.folder.parent.name} (whole step) with ckpt-tools"
    if plan.scope == WHOLE_RUN:
        return f"Upload the run's checkpoints (last: {plan.folder.parent.name}) with ckpt-tools"
    return f"Upload {', '.join(f.name for f in plan.weights)} with ckpt-tools"


def _known_secrets(token: str | None) -> tuple[str, ...]:
    """The explicit token and the one huggingface_hub would use, to mask them out of messages."""
    from huggingface_hub import get_token

    found: list[str] = [token] if token else []
    with contextlib.suppress(Exception):  # a broken token file must not hide the real error later
        resolved = get_token()
        if resolved:
            found.append(resolved)
    return tuple(dict.fromkeys(found))


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise UsageError(f"{name}={raw!r}: expected a positive number of seconds")
    return value


@contextlib.contextmanager
def _bounded_client(bounds: Bounds) -> Iterator[None]:
    """Give huggingface_hub a bounded HTTP client for the duration of a push (see module doc)."""
    try:
        import huggingface_hub
        from huggingface_hub.utils import _http
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        yield
        return
    set_factory = getattr(huggingface_hub, "set_client_factory", None)
    default: Callable[[], Any] | None = getattr(_http, "default_client_factory", None)
    previous = getattr(_http, "_GLOBAL_CLIENT_FACTORY", default)
    if set_factory is None or default is None or previous is not default:
        yield  # an older client, or a factory the caller installed: leave it alone
        return
    from ckpt_tools.hub.client import bounded_client_factory

    set_factory(bounded_client_factory(bounds, default))
    try:
        yield
    finally:
        set_factory(previous)


@contextlib.contextmanager
def _hub_errors(
    repo_id: str, stage: str, endpoint: str, secrets: tuple[str, ...], *, local: bool = False
) -> Iterator[None]:
    """Turn anything the client raises into one line: the Hub's failures as :class:`HubPushError`,
    our own (``local``: every failure of this stage is) as the local error it is; tokens masked."""
    try:
        yield
    except CkptError:
        raise
    except Exception as e:
        ours = _local_failure(e, repo_id, local)
        if ours is not None:
            raise type(ours)(_scrub(str(ours), secrets)) from None
        failure, outcome = _describe(e, repo_id, stage, endpoint)
        raise HubPushError(_scrub(failure, secrets), outcome) from None


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and what caused it (the client wraps an upload's failure in a RuntimeError)."""
    out: list[BaseException] = []
    while error is not None and error not in out and len(out) < 20:
        out.append(error)
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return out


_REMOTE_TYPES = (DeadlineExceeded, ResponseTooLarge, ConnectionError, TimeoutError, socket.gaierror, ssl.SSLError)


def _is_remote(error: BaseException) -> bool:
    """Raised by the Hub's answer or the network to it (not by reading or encoding our own data)."""
    return (
        isinstance(error, _REMOTE_TYPES)
        or getattr(error, "response", None) is not None
        or _is_network_error(error)
        or any(cls.__name__ == "OfflineModeIsEnabled" for cls in type(error).__mro__)
    )


def _local_failure(error: Exception, repo_id: str, local: bool) -> CkptError | None:
    """The local error ``error`` is - a file we cannot read, text we cannot encode, a full disk - or None."""
    chain = _chain(error)
    if not local and any(_is_remote(e) for e in chain):
        return None
    root = chain[-1]
    nothing = "a local problem, not the Hub's; nothing was published"
    if isinstance(root, UnicodeError):
        return CheckpointError(
            f"cannot send the push to {repo_id}: {_first_line(root)} (text that is not valid UTF-8); {nothing}"
        )
    if isinstance(root, OSError):
        where = _printable(root.filename) if root.filename is not None else "a local file"
        reason = root.strerror or _first_line(root) or type(root).__name__
        if root.errno in _FULL_DISK:
            return WriteError(f"{where}: cannot be written during the push to {repo_id} ({reason}); {nothing}")
        return CheckpointError(
            f"{where}: cannot be read during the push to {repo_id} ({reason}); {nothing}; fix it and push again"
        )
    if local:
        return CheckpointError(
            f"cannot prepare the files of the push to {repo_id} ({type(root).__name__}: {_first_line(root)}); {nothing}"
        )
    return None


def _describe(error: Exception, repo_id: str, stage: str, endpoint: str) -> tuple[str, str]:
    """The failure ("Hub push to REPO failed (STEP): CAUSE") and what the Hub holds now."""
    chain = _chain(error)
    error = next(
        (e for e in chain if isinstance(getattr(getattr(e, "response", None), "status_code", None), int)), None
    ) or next((e for e in chain if _is_remote(e)), error)  # type: ignore[assignment]
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    stage = _refine_stage(error, stage)
    head = f"Hub push to {repo_id} failed ({stage})"
    names = {cls.__name__ for cls in type(error).__mro__}
    host = _public_endpoint(endpoint)
    connect = any(n in ("ConnectError", "ConnectionError", "ConnectionRefusedError", "ConnectTimeout") for n in names)
    # A commit request that got no answer may have been applied by the Hub all the same.
    outcome = (
        "the Hub may or may not have made the commit (pushing again makes no second one)"
        if stage == "commit" and not isinstance(status, int) and not connect
        else "nothing was published"
    )
    if isinstance(status, int):
        return f"{head}: HTTP {status}{_status_hint(status, error, repo_id)}", outcome
    if "OfflineModeIsEnabled" in names:
        return f"{head}: HF_HUB_OFFLINE is set, so nothing can be published (unset it)", outcome
    if isinstance(error, DeadlineExceeded):
        return (
            f"{head}: no complete answer from {host} within {error.seconds:g} s (it kept the request open"
            f" without finishing it; set {DEADLINE_ENV} to allow longer)",
            outcome,
        )
    if isinstance(error, ResponseTooLarge):
        return (
            f"{head}: the answer from {host} was larger than {human_bytes(error.limit)}, more than any Hub API"
            " reply; refused, the rest was not read",
            outcome,
        )
    if any("Timeout" in n for n in names):
        timeout = _seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)
        return f"{head}: no answer from {host} within {timeout:g} s (set {TIMEOUT_ENV} to wait longer)", outcome
    if connect:
        return f"{head}: cannot connect to {host} ({_first_line(error)})", outcome
    if _is_network_error(error):
        return f"{head}: network error talking to {host} ({type(error).__name__}: {_first_line(error)})", outcome
    return f"{head}: unexpected answer from {host} ({type(error).__name__}: {_first_line(error)})", outcome


def _refine_stage(error: Exception, stage: str) -> str:
    """Name the step of ``create_commit`` that failed, from the request that failed."""
    request = None
    with contextlib.suppress(Exception):  # httpx raises when an exception carries no request
        request = getattr(getattr(error, "response", None), "request", None) or getattr(error, "request", None)
    if request is None or stage != "upload":
        return stage
    url, method = str(getattr(request, "url", "")), str(getattr(request, "method", ""))
    for marker, name in (
        ("/preupload/", "pre-upload check"),
        ("/info/lfs/objects/batch", "LFS upload negotiation"),
        ("/info/lfs/objects/verify", "LFS upload verification"),
        ("/commit/", "commit"),
        ("/api/validate-yaml", "model card validation"),
    ):
        if marker in url:
            return name
    return "uploading file contents" if method == "PUT" else stage


def _status_hint(status: int, error: Exception, repo_id: str) -> str:
    if status == 401:
        return " Unauthorized: no valid token (set HF_TOKEN or run `hf auth login`)"
    if status == 403:
        return f" Forbidden: the token may not write to {repo_id.split('/')[0]}"
    server = getattr(error, "server_message", None)
    detail = _first_line(server) if isinstance(server, str) and server.strip() else ""
    return f" ({detail})" if detail else ""


def _is_network_error(error: BaseException) -> bool:
    module = type(error).__module__.split(".")[0]
    return module in ("httpx", "httpx2", "httpcore", "httpcore2", "requests", "urllib3") or isinstance(
        error, ConnectionError
    )


def _public_endpoint(endpoint: str) -> str:
    """The endpoint without any ``user:password@`` part."""
    parts = urlsplit(endpoint)
    host = parts.hostname or endpoint
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "") if parts.scheme else host


def _first_line(value: object) -> str:
    text = str(value).strip()
    line = text.splitlines()[0] if text else ""
    return line[:200]


def _scrub(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return " ".join(text.split("\n"))
