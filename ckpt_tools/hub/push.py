"""Upload a checked folder as a Hub model repo, with ``huggingface_hub`` doing the protocol.

One push is: create the repo (``exist_ok``), create the branch when ``revision`` names one,
then one ``create_commit`` holding the planned files plus the generated card. The commit is
atomic on the Hub side: a failure anywhere before it (pre-upload, LFS upload) leaves the
repo as it was, and a retry re-sends only what the Hub does not already hold.

Why the client's HTTP timeouts are set here: ``huggingface_hub`` 2.4 builds its shared
``httpx2.Client`` with ``timeout=None`` and passes no timeout on the upload calls
(pre-upload, LFS batch, LFS PUT, commit), so a server that accepts a connection and never
answers would hang a push - and the end of a training job - forever. ``HF_HUB_ETAG_TIMEOUT``
and ``HF_HUB_DOWNLOAD_TIMEOUT`` only cover downloads. During a push we install a client
factory (the public ``huggingface_hub.set_client_factory``) that is the library's default
client with a timeout of ``CKPT_TOOLS_HUB_TIMEOUT`` seconds (default 120; connect at most
10 s), and restore the previous factory afterwards. A factory the caller installed
themselves is left alone: its timeouts are theirs. The library also retries LFS uploads,
pre-upload and LFS batch calls on 5xx/429/timeouts (5 tries, 1-8 s back-off); create_repo
and the commit call are not retried.

Tokens: ``token=None`` lets the client resolve ``HF_TOKEN`` or the token file under
``HF_HOME``; the resolved value is only used to mask it out of every message we raise and
to refuse publishing a file that contains it. It is never printed or logged.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from ckpt_tools.errors import CkptError, HubError, UsageError
from ckpt_tools.hub.card import build_model_card
from ckpt_tools.hub.files import README, PublishPlan, plan_publish, resolve_publish_folder

TIMEOUT_ENV = "CKPT_TOOLS_HUB_TIMEOUT"
DEFAULT_TIMEOUT_S = 120.0
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
_RETRY_HINT = "local files untouched; a retry is safe"


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
) -> PushResult:
    """Publish a converted ``pretrained_model/`` (or a step dir, or a convert output dir) as a model repo.

    Uploads only the folder's top-level ``*.safetensors``, ``*.json`` and ``*.md`` files, plus
    a generated ``README.md`` model card unless the folder has its own or ``model_card`` is
    False. ``private`` applies to a repo this call creates; pushing with ``private=True`` to an
    existing public repo is refused rather than silently publishing. ``revision`` names a
    branch (created from main when missing). Raises :class:`HubError` (exit code 5) for any
    network or server failure, with the local files untouched.
    """
    upload = prepare_push(
        folder, repo_id, revision=revision, commit_message=commit_message, token=token, model_card=model_card
    )
    with _client_timeouts(_timeout_seconds()):
        return _push(upload, private, revision, token, endpoint)


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
    plan = plan_publish(resolve_publish_folder(folder))
    secrets = _known_secrets(token)
    plan.refuse_secrets(secrets)
    card = build_model_card(plan, repo_id=repo_id, secrets=secrets) if model_card and not plan.has_readme else None
    return PreparedPush(plan, repo_id, card, commit_message or _default_message(plan), secrets)


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
    with _hub_errors(repo_id, "read the local files", api.endpoint, secrets):
        ops = [CommitOperationAdd(path_in_repo=f.name, path_or_fileobj=str(f.path)) for f in plan.files]
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
    )


def _default_message(plan: PublishPlan) -> str:
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


def _timeout_seconds() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"{TIMEOUT_ENV}={raw!r}: expected a positive number of seconds")
    return value


@contextlib.contextmanager
def _client_timeouts(seconds: float) -> Iterator[None]:
    """Give huggingface_hub's shared HTTP client a timeout for the duration of a push (see module doc)."""
    try:
        import huggingface_hub
        from huggingface_hub.utils import _http
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        yield
        return
    set_factory = getattr(huggingface_hub, "set_client_factory", None)
    default = getattr(_http, "default_client_factory", None)
    previous = getattr(_http, "_GLOBAL_CLIENT_FACTORY", default)
    if set_factory is None or default is None or previous is not default:
        yield  # an older client, or a factory the caller installed: leave it alone
        return

    def factory() -> Any:
        client = default()
        client.timeout = type(client.timeout)(seconds, connect=min(seconds, 10.0))
        return client

    set_factory(factory)
    try:
        yield
    finally:
        set_factory(previous)


@contextlib.contextmanager
def _hub_errors(repo_id: str, stage: str, endpoint: str, secrets: tuple[str, ...]) -> Iterator[None]:
    """Turn anything the client raises into one :class:`HubError` line, with tokens masked."""
    try:
        yield
    except CkptError:
        raise
    except Exception as e:
        raise HubError(_scrub(_describe(e, repo_id, stage, endpoint), secrets)) from None


def _describe(error: Exception, repo_id: str, stage: str, endpoint: str) -> str:
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    stage = _refine_stage(error, stage)
    head = f"Hub push to {repo_id} failed ({stage})"
    names = {cls.__name__ for cls in type(error).__mro__}
    if isinstance(status, int):
        return f"{head}: HTTP {status}{_status_hint(status, error, repo_id)}; {_RETRY_HINT}"
    if "OfflineModeIsEnabled" in names:
        return f"{head}: HF_HUB_OFFLINE is set, so nothing can be published; unset it and retry ({_RETRY_HINT})"
    host = _public_endpoint(endpoint)
    if any("Timeout" in n for n in names):
        return (
            f"{head}: no answer from {host} within {_timeout_seconds():g} s"
            f" (set {TIMEOUT_ENV} to wait longer); {_RETRY_HINT}"
        )
    if any(n in ("ConnectError", "ConnectionError", "ConnectionRefusedError") for n in names):
        return f"{head}: cannot connect to {host} ({_first_line(error)}); {_RETRY_HINT}"
    if _is_network_error(error):
        return f"{head}: network error talking to {host} ({type(error).__name__}: {_first_line(error)}); {_RETRY_HINT}"
    if isinstance(error, OSError):
        return f"{head}: {type(error).__name__}: {_first_line(error)}; {_RETRY_HINT}"
    return f"{head}: unexpected answer from {host} ({type(error).__name__}: {_first_line(error)}); {_RETRY_HINT}"


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


def _is_network_error(error: Exception) -> bool:
    module = type(error).__module__.split(".")[0]
    return module in ("httpx", "httpx2", "httpcore", "requests", "urllib3") or isinstance(error, ConnectionError)


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
