"""A loopback Hugging Face Hub: the API subset the real ``huggingface_hub`` client speaks to publish and download.

Tests point the real client at it with ``HF_ENDPOINT`` (see
:mod:`tests.support.hub_fixtures`) and then assert on what arrived: the files of each commit,
their bytes, every request made. It is strict where the real Hub is strict - writes need a
valid ``Authorization: Bearer`` token with rights on the namespace, an LFS upload must match
the sha256 and size it announced, a commit may only reference LFS objects that were
uploaded - so a client bug shows up as a failure here rather than in production.

Endpoints (``{repo}`` is ``namespace/name``; model repos, dataset repos under ``datasets/``):

    POST /api/repos/create                          -> {"url"}; 409 (with "url") if it exists
    POST /api/validate-yaml                         -> {"errors": [], "warnings": []}; 400 on bad YAML
    GET  /api/whoami-v2                             -> {"name", "type": "user", ...}
    POST /api/{type}s/{repo}/preupload/{rev}        -> per file uploadMode lfs|regular, oid of the current file
    POST /api/{type}s/{repo}/commit/{rev}           NDJSON header/file/lfsFile/deletedFile/deletedFolder
    POST /api/{type}s/{repo}/branch/{branch}        -> {}; 409 if it exists
    GET  /api/{type}s/{repo}[/revision/{rev}]       -> {"id", "sha", "private", "siblings", ...}
    GET  /api/{type}s/{repo}/tree/{rev}[/{path}]    -> [{"type", "path", "size", "oid", "lfs"?}]
    POST /{prefix}{repo}.git/info/lfs/objects/batch -> git-lfs batch (basic transfer, upload + verify actions)
    POST /{prefix}{repo}.git/info/lfs/objects/verify
    PUT  /_lfs/{ticket}                             the upload "presigned URL": raw bytes, no auth header
    HEAD|GET /{prefix}{repo}/resolve/{rev}/{path}   X-Repo-Commit, ETag, Content-Length; Range; X-Error-Code

Each recorded request keeps the bytes of the answer body it was sent (``sent``);
:meth:`HubServer.bytes_sent` sums them, so a test can say how much a client downloaded.

Fault knobs (:class:`Faults`, route names as in :data:`ROUTES`): ``fail`` answers a status
(default 500) instead of handling the request, ``hang`` holds the answer until
:meth:`Faults.release` (or a safety cap), ``drop`` closes the connection without answering,
``trickle`` answers one byte at a time (of the headers or of the body) every ``interval``
seconds - each read of the client returns, so no per-read timeout fires - and ``flood``
answers 200 with a body of ``size`` bytes (announced, or read until the connection closes);
each takes ``skip`` (let N matching requests through first) and ``times``. ``stop()`` makes the
port refuse connections; ``start()`` brings the same server back on the same port with its
repositories intact, so a test can retry.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

ROUTES = (
    "create_repo",
    "validate_yaml",
    "whoami",
    "preupload",
    "commit",
    "branch",
    "repo_info",
    "tree",
    "lfs_batch",
    "lfs_verify",
    "lfs_put",
    "resolve",
    "unknown",
)

# Files the preupload endpoint sends through LFS whatever their size (like the Hub's default .gitattributes).
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".npy", ".npz", ".parquet")
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024
GITATTRIBUTES = "".join(f"*{s} filter=lfs diff=lfs merge=lfs -text\n" for s in LFS_SUFFIXES).encode()
HANG_CAP_S = 120.0  # a hung handler gives up on its own eventually, so a broken test cannot wedge the process

_TYPE_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO = rf"(?P<repo>{_NAME}/{_NAME})"
_API_REPO = re.compile(
    rf"^/api/(?P<type>models|datasets|spaces)/{_REPO}"
    r"(?:/(?P<action>preupload|commit|branch|revision|tree)(?:/(?P<rest>.*))?)?$"
)
_LFS = re.compile(rf"^/(?P<prefix>datasets/|spaces/)?{_REPO}\.git/info/lfs/objects/(?P<op>batch|verify)$")
_RESOLVE = re.compile(rf"^/(?P<prefix>datasets/|spaces/)?{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


def git_blob_oid(content: bytes) -> str:
    """Git's object id of a file (what the Hub reports for non-LFS files)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass(frozen=True)
class StoredFile:
    content: bytes
    lfs: bool

    @cached_property  # once per file: a ranged read of a 256 MiB file must not hash all of it again
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @cached_property
    def oid(self) -> str:
        """What preupload reports as the file's current oid (sha256 for LFS, git blob oid otherwise)."""
        return self.sha256 if self.lfs else git_blob_oid(self.content)


@dataclass(frozen=True)
class CommitOp:
    """One line of a commit payload, as received (``key`` is ``file``, ``lfsFile``, ``deletedFile`` ...)."""

    key: str
    path: str
    size: int | None = None
    oid: str | None = None


@dataclass
class Commit:
    oid: str
    parent: str | None
    message: str
    description: str
    files: dict[str, StoredFile]
    ops: tuple[CommitOp, ...] = ()
    author: str | None = None


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    owner: str
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit | None:
        oid = self.branches.get(revision, revision)
        return self.commits.get(oid)

    def history(self, branch: str = "main") -> list[Commit]:
        """Commits of ``branch``, newest first."""
        out, commit = [], self.resolve(branch)
        while commit is not None:
            out.append(commit)
            commit = self.commits.get(commit.parent) if commit.parent else None
        return out


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it. The Authorization value is never kept: only who it authenticated."""

    route: str
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    status: int
    user: str | None
    had_auth_header: bool
    sent: int = 0  # bytes of the answer's body written to the client (what a download cost)

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class _Fault:
    route: str
    action: str  # "fail" | "hang" | "drop" | "trickle" | "flood"
    status: int
    skip: int
    times: int
    then: str = "drop"  # what a hang does once released: "drop" the connection or "answer" normally
    phase: str = "headers"  # what a trickle sends slowly: "headers" or "body"
    interval: float = 0.0  # seconds between the bytes of a trickle
    size: int = 0  # bytes of a flood's body
    announce: bool = True  # a flood sends Content-Length (else the body ends when the connection closes)
    seen: int = 0
    fired: int = 0


class Faults:
    """Scripted misbehaviour, matched per route in the order the faults were added."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._released = threading.Event()

    def fail(self, route: str, status: int = 500, *, skip: int = 0, times: int = 1) -> None:
        self._add(_Fault(route, "fail", status, skip, times))

    def hang(self, route: str, *, skip: int = 0, times: int = 1, then: str = "drop") -> None:
        """Hold matching requests until :meth:`release`; then drop the connection (or ``then="answer"``).

        Dropping by default makes a timeout test deterministic: the server never acts on a
        request the client gave up on. ``answer`` models a server that completes late.
        """
        if then not in ("drop", "answer"):
            raise ValueError("then must be 'drop' or 'answer'")
        self._released.clear()
        self._add(_Fault(route, "hang", 0, skip, times, then))

    def drop(self, route: str, *, skip: int = 0, times: int = 1) -> None:
        self._add(_Fault(route, "drop", 0, skip, times))

    def trickle(
        self, route: str, *, phase: str = "headers", interval: float = 0.3, skip: int = 0, times: int = 1
    ) -> None:
        """Answer matching requests one byte every ``interval`` s, forever (until :meth:`release` or a cap).

        ``phase="headers"``: the status line, then the headers byte by byte; ``"body"``: complete
        headers announcing a 1 MB JSON body, then the body byte by byte. Either way every read
        of the client returns data well within any per-read timeout.
        """
        if phase not in ("headers", "body"):
            raise ValueError("phase must be 'headers' or 'body'")
        self._released.clear()
        self._add(_Fault(route, "trickle", 200, skip, times, phase=phase, interval=interval))

    def flood(self, route: str, size: int, *, announce: bool = True, skip: int = 0, times: int = 1) -> None:
        """Answer matching requests 200 with ``size`` bytes of JSON whitespace, as fast as the client reads."""
        self._add(_Fault(route, "flood", 200, skip, times, size=size, announce=announce))

    def release(self) -> None:
        """Let every hung request go on (the client has usually given up by then)."""
        self._released.set()

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
        self.release()

    def fired(self, route: str | None = None) -> int:
        with self._lock:
            return sum(f.fired for f in self._faults if route is None or f.route == route)

    def _add(self, fault: _Fault) -> None:
        if fault.route not in ROUTES:
            raise ValueError(f"unknown route {fault.route!r}; one of {ROUTES}")
        with self._lock:
            self._faults.append(fault)

    def _match(self, route: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.route != route or fault.fired >= fault.times:
                    continue
                fault.seen += 1
                if fault.seen > fault.skip:
                    fault.fired += 1
                    return fault
            return None

    def _wait(self) -> None:
        self._released.wait(HANG_CAP_S)


class HubState:
    """Repositories, LFS objects and the request log; shared by every start/stop of one server."""

    def __init__(self, tokens: dict[str, str], orgs: dict[str, set[str]]) -> None:
        self.lock = threading.RLock()
        self.tokens = dict(tokens)
        self.orgs = {user: set(names) for user, names in orgs.items()}
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.tickets: dict[str, tuple[str, int]] = {}
        self.requests: list[RecordedRequest] = []
        self._counter = 0

    def new_commit_oid(self) -> str:
        with self.lock:
            self._counter += 1
            return hashlib.sha1(f"commit {self._counter} {time.time_ns()}".encode()).hexdigest()

    def may_write(self, user: str | None, namespace: str) -> bool:
        return user is not None and (namespace == user or namespace in self.orgs.get(user, set()))

    def may_read(self, user: str | None, repo: Repo) -> bool:
        return not repo.private or self.may_write(user, repo.repo_id.split("/")[0])


class HubServer:
    """The server handle tests hold: URL, state, faults, request log; start/stop on a fixed port."""

    def __init__(
        self,
        tokens: dict[str, str] | None = None,
        *,
        orgs: dict[str, set[str]] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.state = HubState(tokens if tokens is not None else {}, orgs or {})
        self.faults = Faults()
        self.host = host
        self.port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    def start(self) -> HubServer:
        if self._httpd is not None:
            return self
        handler = type("BoundHandler", (_Handler,), {"server_handle": self})
        self._httpd = ThreadingHTTPServer((self.host, self.port), handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="hub-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening: connections to the port are refused until :meth:`start`."""
        self.faults.release()
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.faults.clear()
        self.stop()

    # -- what tests look at -------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self.state.lock:
            return list(self.state.requests)

    def requests_for(self, route: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.route == route]

    def bytes_sent(self, route: str | None = None) -> int:
        """Bytes of answer bodies written to clients (of ``route`` only, when given): what downloads cost."""
        return sum(r.sent for r in self.requests if route is None or r.route == route)

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        with self.state.lock:
            return self.state.repos[(repo_type, repo_id)]

    def has_repo(self, repo_id: str, repo_type: str = "model") -> bool:
        with self.state.lock:
            return (repo_type, repo_id) in self.state.repos

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        """Path -> bytes of the repo at ``revision`` (a branch or a commit oid)."""
        with self.state.lock:
            commit = self.repo(repo_id, repo_type).resolve(revision)
            if commit is None:
                raise KeyError(f"{repo_id}: no revision {revision!r}")
            return {path: f.content for path, f in commit.files.items()}

    def seed_repo(
        self,
        repo_id: str,
        files: dict[str, bytes],
        *,
        repo_type: str = "model",
        private: bool = False,
        message: str = "seed",
    ) -> str:
        """Create (or extend) a repo directly, e.g. a dataset a training test downloads. Returns the commit oid."""
        with self.state.lock:
            repo = self.state.repos.get((repo_type, repo_id))
            if repo is None:
                repo = _create_repo(self.state, repo_type, repo_id, private, repo_id.split("/")[0])
            head = repo.resolve("main")
            assert head is not None
            stored = {p: StoredFile(c, _is_lfs(p, len(c), c[:512])) for p, c in files.items()}
            for f in stored.values():
                if f.lfs:
                    self.state.lfs[f.sha256] = f.content
            commit = Commit(self.state.new_commit_oid(), head.oid, message, "", {**head.files, **stored})
            repo.commits[commit.oid] = commit
            repo.branches["main"] = commit.oid
            return commit.oid


def _create_repo(state: HubState, repo_type: str, repo_id: str, private: bool, owner: str) -> Repo:
    repo = Repo(repo_type, repo_id, private, owner)
    first = Commit(
        state.new_commit_oid(), None, "initial commit", "", {".gitattributes": StoredFile(GITATTRIBUTES, False)}
    )
    repo.commits[first.oid] = first
    repo.branches["main"] = first.oid
    state.repos[(repo_type, repo_id)] = repo
    return repo


def _is_lfs(path: str, size: int, sample: bytes) -> bool:
    return path.endswith(LFS_SUFFIXES) or size >= LFS_SIZE_THRESHOLD or b"\0" in sample


class _Reply(Exception):
    """Raised by a route to answer with an error (status, message, X-Error-Code)."""

    def __init__(self, status: int, message: str, code: str | None = None, extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra or {}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle's algorithm each small answer would wait
    # for the client's delayed ACK (40 ms), which a client making hundreds of ranged reads pays for each.
    disable_nagle_algorithm = True
    server_handle: HubServer  # set on the bound subclass

    # -- plumbing -----------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is in ``HubServer.requests``."""

    def do_GET(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    @property
    def state(self) -> HubState:
        return self.server_handle.state

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _user(self) -> tuple[str | None, bool]:
        auth = self.headers.get("Authorization")
        if not auth:
            return None, False
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or token not in self.state.tokens:
            raise _Reply(401, "Invalid credentials in Authorization header")
        return self.state.tokens[token], True

    def _handle(self) -> None:
        parts = urlsplit(self.path)
        path, query = unquote(parts.path), parse_qs(parts.query)
        raw_path = parts.path
        body = self._read_body() if self.command in ("POST", "PUT") else b""
        route, handler, args = self._route(raw_path)
        status, user, had_auth = 500, None, bool(self.headers.get("Authorization"))
        try:
            fault = self.server_handle.faults._match(route)
            if fault is not None and fault.action == "hang":
                self.server_handle.faults._wait()
            if fault is not None and (fault.action == "drop" or (fault.action == "hang" and fault.then == "drop")):
                status = 0
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            if fault is not None and fault.action == "fail":
                raise _Reply(fault.status, f"injected failure ({route})")
            if fault is not None and fault.action in ("trickle", "flood"):
                status = fault.status
                self.close_connection = True
                with contextlib.suppress(OSError):
                    if fault.action == "trickle":
                        self._trickle(fault)
                    else:
                        self._flood(fault)
                return
            try:
                user, had_auth = self._user()
            except _Reply:
                if route == "lfs_put":  # presigned URL: no auth expected, none checked
                    user = None
                else:
                    raise
            status = 200
            result = handler(self, user, body, query, **args)
            status = result[0]
            self._send(*result)
        except _Reply as e:
            status = e.status
            self._send_error(e)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            headers = {k.lower(): v for k, v in self.headers.items() if k.lower() != "authorization"}
            sent = getattr(self, "_sent", 0)
            self._sent = 0
            record = RecordedRequest(route, self.command, path, query, headers, body, status, user, had_auth, sent)
            with self.state.lock:
                self.state.requests.append(record)

    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        if isinstance(payload, bytes | bytearray):
            data = bytes(payload)
            content_type = "application/octet-stream"
        else:
            data = json.dumps(payload).encode()
            content_type = "application/json"
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            length = (headers or {}).get("Content-Length")
            if length is None:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
                self._sent = len(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _trickle(self, fault: _Fault) -> None:
        """One byte every ``fault.interval`` s until released, the cap, or the client leaving (OSError)."""
        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
        if fault.phase == "body":
            self.wfile.write(b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n")
        self.wfile.flush()
        deadline = time.monotonic() + HANG_CAP_S
        filler = b" " if fault.phase == "body" else b"X-Slow: " + b"a" * 1_000_000
        sent = 0
        while time.monotonic() < deadline and not self.server_handle.faults._released.wait(fault.interval):
            self.wfile.write(filler[sent % len(filler) : sent % len(filler) + 1])
            self.wfile.flush()
            sent += 1
        self.connection.shutdown(socket.SHUT_RDWR)

    def _flood(self, fault: _Fault) -> None:
        """``fault.size`` bytes of body, in 1 MiB writes; the client decides how much of it to read."""
        head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {fault.size}\r\n" if fault.announce else "Connection: close\r\n"
        self.wfile.write(head.encode() + b"\r\n")
        chunk = b" " * (1 << 20)
        left = fault.size
        while left > 0:
            self.wfile.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)

    def _send_error(self, error: _Reply) -> None:
        headers = {"X-Error-Message": error.message}
        if error.code:
            headers["X-Error-Code"] = error.code
        self._send(error.status, {"error": error.message, **error.extra}, headers)

    def _route(self, raw_path: str) -> tuple[str, Any, dict[str, Any]]:
        method = self.command
        if raw_path == "/api/repos/create" and method == "POST":
            return "create_repo", _Handler._create_repo, {}
        if raw_path == "/api/validate-yaml" and method == "POST":
            return "validate_yaml", _Handler._validate_yaml, {}
        if raw_path == "/api/whoami-v2" and method == "GET":
            return "whoami", _Handler._whoami, {}
        if raw_path.startswith("/_lfs/") and method == "PUT":
            return "lfs_put", _Handler._lfs_put, {"ticket": raw_path[len("/_lfs/") :]}
        m = _LFS.match(raw_path)
        if m and method == "POST":
            repo_type = "dataset" if m["prefix"] == "datasets/" else "space" if m["prefix"] else "model"
            route = "lfs_batch" if m["op"] == "batch" else "lfs_verify"
            fn = _Handler._lfs_batch if m["op"] == "batch" else _Handler._lfs_verify
            return route, fn, {"repo_type": repo_type, "repo_id": m["repo"]}
        m = _RESOLVE.match(raw_path)
        if m and method in ("GET", "HEAD"):
            repo_type = "dataset" if m["prefix"] == "datasets/" else "space" if m["prefix"] else "model"
            args = {"repo_type": repo_type, "repo_id": m["repo"], "rev": unquote(m["rev"]), "file": unquote(m["path"])}
            return "resolve", _Handler._resolve, args
        m = _API_REPO.match(raw_path)
        if m:
            repo_type = m["type"][:-1]
            action, rest = m["action"], unquote(m["rest"] or "")
            base = {"repo_type": repo_type, "repo_id": m["repo"]}
            if action is None and method == "GET":
                return "repo_info", _Handler._repo_info, {**base, "rev": "main"}
            if action == "revision" and method == "GET":
                return "repo_info", _Handler._repo_info, {**base, "rev": rest}
            if action == "preupload" and method == "POST":
                return "preupload", _Handler._preupload, {**base, "rev": rest}
            if action == "commit" and method == "POST":
                return "commit", _Handler._commit, {**base, "rev": rest}
            if action == "branch" and method == "POST":
                return "branch", _Handler._branch, {**base, "branch": rest}
            if action == "tree" and method == "GET":
                rev, _, sub = rest.partition("/")
                return "tree", _Handler._tree, {**base, "rev": rev, "sub": sub}
        return "unknown", _Handler._unknown, {}

    # -- helpers shared by routes ----------------------------------------------------------

    def _repo(self, repo_type: str, repo_id: str, user: str | None, *, write: bool = False) -> Repo:
        repo = self.state.repos.get((repo_type, repo_id))
        if write:
            self._require_write(user, repo_id.split("/")[0])
        if repo is None or not self.state.may_read(user, repo):
            # The Hub answers 401 for a missing repo and a private one alike, not to reveal which.
            raise _Reply(401 if user is None else 404, f"Repository not found: {repo_id}", "RepoNotFound")
        return repo

    def _require_write(self, user: str | None, namespace: str) -> None:
        if user is None:
            raise _Reply(401, "You must be authenticated to write")
        if not self.state.may_write(user, namespace):
            raise _Reply(403, f"You don't have the rights to write to {namespace}")

    def _commit_for(self, repo: Repo, rev: str) -> Commit:
        commit = repo.resolve(rev)
        if commit is None:
            raise _Reply(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return commit

    def _repo_url(self, repo: Repo) -> str:
        return f"{self.server_handle.url}/{_TYPE_PREFIX[repo.repo_type]}{repo.repo_id}"

    @staticmethod
    def _json(body: bytes) -> Any:
        try:
            return json.loads(body or b"{}")
        except json.JSONDecodeError:
            raise _Reply(400, "Body is not valid JSON") from None

    # -- routes: each returns (status, payload[, headers]) ------------------------------------

    def _create_repo(self, user: str | None, body: bytes, query: Any) -> tuple[int, Any]:
        data = self._json(body)
        name, org = data.get("name"), data.get("organization")
        repo_type = data.get("type") or "model"
        if user is None:
            raise _Reply(401, "You must be authenticated to create a repo")
        namespace = org or user
        repo_id = f"{namespace}/{name}"
        if not isinstance(name, str) or not re.fullmatch(_NAME, name) or repo_type not in _TYPE_PREFIX:
            raise _Reply(400, f"Invalid repo name or type: {name!r} {repo_type!r}")
        self._require_write(user, namespace)
        private = data.get("visibility") == "private" or data.get("private") is True
        with self.state.lock:
            existing = self.state.repos.get((repo_type, repo_id))
            if existing is not None:
                url = self._repo_url(existing)
                raise _Reply(409, "You already created this model repo", extra={"url": url})
            repo = _create_repo(self.state, repo_type, repo_id, private, user)
        return 200, {"url": self._repo_url(repo), "name": repo_id, "id": repo_id}

    def _validate_yaml(self, user: str | None, body: bytes, query: Any) -> tuple[int, Any]:
        content = self._json(body).get("content", "")
        errors = _front_matter_errors(content if isinstance(content, str) else "")
        if errors:
            raise _Reply(400, "; ".join(errors))
        return 200, {"errors": [], "warnings": []}

    def _whoami(self, user: str | None, body: bytes, query: Any) -> tuple[int, Any]:
        if user is None:
            raise _Reply(401, "Invalid credentials in Authorization header")
        orgs = [{"name": o, "type": "org"} for o in sorted(self.state.orgs.get(user, set()))]
        return 200, {"type": "user", "name": user, "fullname": user, "orgs": orgs, "auth": {"type": "access_token"}}

    def _preupload(self, user: str | None, body: bytes, query: Any, repo_type: str, repo_id: str, rev: str):
        with self.state.lock:
            repo = self._repo(repo_type, repo_id, user, write=True)
            commit = self._commit_for(repo, rev)
            out = []
            for item in self._json(body).get("files", []):
                path, size = item["path"], int(item["size"])
                sample = base64.b64decode(item.get("sample", ""))
                current = commit.files.get(path)
                out.append(
                    {
                        "path": path,
                        "uploadMode": "lfs" if _is_lfs(path, size, sample) else "regular",
                        "shouldIgnore": False,
                        "oid": current.oid if current is not None else None,
                    }
                )
        return 200, {"files": out, "commitOid": commit.oid}

    def _lfs_batch(self, user: str | None, body: bytes, query: Any, repo_type: str, repo_id: str):
        data = self._json(body)
        with self.state.lock:
            repo = self._repo(repo_type, repo_id, user, write=data.get("operation") == "upload")
            if data.get("operation") != "upload":
                raise _Reply(400, "only the upload operation is served")
            objects = []
            base = self._repo_url(repo)
            for obj in data.get("objects", []):
                oid, size = str(obj["oid"]), int(obj["size"])
                entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
                if oid not in self.state.lfs:
                    ticket = secrets.token_hex(12)
                    self.state.tickets[ticket] = (oid, size)
                    entry["actions"] = {
                        "upload": {"href": f"{self.server_handle.url}/_lfs/{ticket}", "expires_in": 3600},
                        "verify": {"href": f"{base}.git/info/lfs/objects/verify"},
                    }
                objects.append(entry)
        return 200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}

    def _lfs_put(self, user: str | None, body: bytes, query: Any, ticket: str) -> tuple[int, Any]:
        with self.state.lock:
            expected = self.state.tickets.get(ticket)
        if expected is None:
            raise _Reply(403, "Unknown or expired upload URL")
        oid, size = expected
        if len(body) != size:
            raise _Reply(400, f"Size mismatch: announced {size} bytes, received {len(body)}")
        if hashlib.sha256(body).hexdigest() != oid:
            raise _Reply(400, "sha256 mismatch: the uploaded bytes do not match the announced oid")
        with self.state.lock:
            self.state.lfs[oid] = body
            self.state.tickets.pop(ticket, None)
        return 200, b""

    def _lfs_verify(self, user: str | None, body: bytes, query: Any, repo_type: str, repo_id: str):
        data = self._json(body)
        with self.state.lock:
            self._repo(repo_type, repo_id, user, write=True)
            stored = self.state.lfs.get(str(data.get("oid")))
        if stored is None or len(stored) != data.get("size"):
            raise _Reply(404, "LFS object not found or of another size")
        return 200, {"oid": data["oid"], "size": len(stored)}

    def _commit(self, user: str | None, body: bytes, query: Any, repo_type: str, repo_id: str, rev: str):
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise _Reply(400, "The commit payload must start with a header line")
        header = lines[0]["value"]
        with self.state.lock:
            repo = self._repo(repo_type, repo_id, user, write=True)
            if rev not in repo.branches:
                raise _Reply(404, f"Invalid rev id: {rev}", "RevisionNotFound")
            head = self._commit_for(repo, rev)
            parent = header.get("parentCommit")
            if parent is not None and parent != head.oid:
                raise _Reply(412, f"A commit has happened since {parent}")
            files, ops = dict(head.files), []
            for line in lines[1:]:
                files, op = self._apply(files, line)
                ops.append(op)
            commit = Commit(
                self.state.new_commit_oid(),
                head.oid,
                str(header.get("summary", "")),
                str(header.get("description", "")),
                files,
                tuple(ops),
                user,
            )
            repo.commits[commit.oid] = commit
            repo.branches[rev] = commit.oid
        url = f"{self._repo_url(repo)}/commit/{commit.oid}"
        return 200, {"success": True, "commitOid": commit.oid, "commitUrl": url, "pullRequestUrl": None}

    def _apply(self, files: dict[str, StoredFile], line: dict[str, Any]) -> tuple[dict[str, StoredFile], CommitOp]:
        key, value = line.get("key"), line.get("value") or {}
        path = value.get("path")
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
            raise _Reply(400, f"Invalid path in commit: {path!r}")
        if key == "file":
            if value.get("encoding") != "base64":
                raise _Reply(400, "Regular files must be base64-encoded")
            content = base64.b64decode(value.get("content", ""))
            files[path] = StoredFile(content, False)
            return files, CommitOp(key, path, len(content), git_blob_oid(content))
        if key == "lfsFile":
            oid, size = value.get("oid"), value.get("size")
            if value.get("algo", "sha256") != "sha256":
                raise _Reply(400, "Only sha256 LFS pointers are accepted")
            content = self.state.lfs.get(str(oid))
            if content is None or len(content) != size:
                raise _Reply(422, f"LFS object {oid} for {path} was never uploaded (or has another size)")
            files[path] = StoredFile(content, True)
            return files, CommitOp(key, path, len(content), str(oid))
        if key == "deletedFile":
            if files.pop(path, None) is None:
                raise _Reply(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
            return files, CommitOp(key, path)
        if key == "deletedFolder":
            prefix = path.rstrip("/") + "/"
            files = {p: f for p, f in files.items() if not p.startswith(prefix)}
            return files, CommitOp(key, path)
        raise _Reply(400, f"Unsupported commit operation {key!r}")

    def _branch(self, user: str | None, body: bytes, query: Any, repo_type: str, repo_id: str, branch: str):
        data = self._json(body)
        with self.state.lock:
            repo = self._repo(repo_type, repo_id, user, write=True)
            if branch in repo.branches:
                raise _Reply(409, f"Branch {branch} already exists")
            start = self._commit_for(repo, str(data.get("startingPoint") or "main"))
            repo.branches[branch] = start.oid
        return 200, {}

    def _repo_info(self, user: str | None, body: bytes, query: Any, repo_type: str, repo_id: str, rev: str):
        with self.state.lock:
            repo = self._repo(repo_type, repo_id, user)
            commit = self._commit_for(repo, rev)
            siblings = [{"rfilename": p, "size": len(f.content)} for p, f in sorted(commit.files.items())]
        return 200, {
            "id": repo_id,
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "author": repo_id.split("/")[0],
            "sha": commit.oid,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "lastModified": "2025-01-01T00:00:00.000Z",
            "createdAt": "2025-01-01T00:00:00.000Z",
        }

    def _tree(self, user: str | None, body: bytes, query: Any, repo_type: str, repo_id: str, rev: str, sub: str):
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        with self.state.lock:
            repo = self._repo(repo_type, repo_id, user)
            commit = self._commit_for(repo, rev)
            entries = _tree_entries(commit.files, sub.strip("/"), recursive)
        return 200, entries

    def _resolve(self, user: str | None, body: bytes, query: Any, repo_type: str, repo_id: str, rev: str, file: str):
        with self.state.lock:
            repo = self._repo(repo_type, repo_id, user)
            commit = self._commit_for(repo, rev)
            stored = commit.files.get(file)
        if stored is None:
            raise _Reply(404, f"Entry not found: {file}", "EntryNotFound")
        data, status = stored.content, 200
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{stored.oid}"', "Accept-Ranges": "bytes"}
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "") or "")
        if match and self.command == "GET":
            start = int(match[1])
            stop = int(match[2]) + 1 if match[2] else len(data)
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
            data, status = data[start:stop], 206
        if self.command == "HEAD":
            headers["Content-Length"] = str(len(data))
        return status, data, headers

    def _unknown(self, user: str | None, body: bytes, query: Any) -> tuple[int, Any]:
        raise _Reply(404, f"Not served by the test Hub: {self.command} {self.path}")


def _tree_entries(files: dict[str, StoredFile], sub: str, recursive: bool) -> list[dict[str, Any]]:
    prefix = f"{sub}/" if sub else ""
    entries: dict[str, dict[str, Any]] = {}
    for path, stored in sorted(files.items()):
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix) :]
        parts = rest.split("/")
        for depth in range(1, len(parts)):
            if recursive or depth == 1:
                folder = prefix + "/".join(parts[:depth])
                entries.setdefault(folder, {"type": "directory", "path": folder, "oid": "0" * 40, "size": 0})
            if not recursive:
                break
        if recursive or len(parts) == 1:
            entry: dict[str, Any] = {"type": "file", "path": path, "size": len(stored.content), "oid": stored.oid}
            if stored.lfs:
                entry["oid"] = git_blob_oid(b"lfs pointer " + stored.sha256.encode())
                entry["lfs"] = {"oid": stored.sha256, "size": len(stored.content), "pointerSize": 134}
            entries[path] = entry
    return list(entries.values())


def _front_matter_errors(content: str) -> list[str]:
    """Like the Hub: a README's YAML front matter, when present, must parse to a mapping."""
    if not content.startswith("---"):
        return []
    end = content.find("\n---", 3)
    if end < 0:
        return ["YAML front matter is not closed"]
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML ships with huggingface_hub's dependencies here
        return []
    try:
        data = yaml.safe_load(content[3:end])
    except yaml.YAMLError as e:
        return [f"Invalid YAML: {e}"]
    return [] if data is None or isinstance(data, dict) else ["YAML front matter must be a mapping"]


def iter_commit_ops(server: HubServer, repo_id: str, branch: str = "main") -> Iterator[CommitOp]:
    """Every operation the client sent to ``branch`` of ``repo_id``, oldest commit first."""
    for commit in reversed(server.repo(repo_id).history(branch)):
        yield from commit.ops


__all__ = ["ROUTES", "Commit", "CommitOp", "Faults", "HubServer", "RecordedRequest", "Repo", "iter_commit_ops"]
