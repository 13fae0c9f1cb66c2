"""The HTTP client huggingface_hub uses during a push: every request has a deadline, every answer a size cap.

Why: a per-read timeout does not bound a request. A server (or a proxy, or a broken load
balancer) that sends one byte every few seconds satisfies every read and holds the push - and
the end of a training job - forever; and huggingface_hub reads a reply whole into memory, so a
server that answers a JSON call with 3 GiB took 6.3 GB of RSS. So during a push:

- each request must be complete - sent, answered, its body read - within a **deadline** of
  ``deadline_s`` plus the bytes it sends at ``MIN_UPLOAD_RATE`` (an upload of a large file gets
  the time a slow but working link needs; a trickle never gets more than that). Past it the
  request is abandoned with :class:`DeadlineExceeded`, which the client does not retry - a
  server that trickled once would trickle five times;
- an answer may make us read at most ``max_response_bytes`` (no Hub API reply comes near it):
  a larger ``Content-Length`` is refused before its body is read, and a body without one is
  cut off at the cap (:class:`ResponseTooLarge`);
- each read, write and connect still times out after ``timeout_s`` (no answer at all).

How, through supported interfaces only: huggingface_hub (1.x on httpx, 2.x on httpx2) builds
its shared client with a factory that ``huggingface_hub.set_client_factory`` replaces. Ours
builds the library's default client's settings (event hooks, redirects) around a transport of
our own on httpcore's public ``ConnectionPool``/``HTTPProxy`` with a ``network_backend``: its
streams clamp each socket operation to the time the current request has left (kept per thread:
the client uploads files from several threads, one request per thread at a time) and count
the bytes sent. The transport maps httpcore's exceptions onto httpx's, as httpx's own does,
so the library's retries and error handling see what they expect.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

MiB = 1 << 20
MIN_UPLOAD_RATE = 256 * 1024  # bytes/s: the slowest upload a deadline still lets finish (about 2 Mbit/s)
MAX_WRITE = 64 * 1024  # bytes per socket write, so the deadline is looked at between them


class DeadlineExceeded(Exception):
    """Marker of the request that was not complete within its deadline (see the module doc)."""

    seconds: float = 0.0


class ResponseTooLarge(Exception):
    """Marker of the answer that would have made us read more than the cap."""

    limit: int = 0


@dataclass(frozen=True)
class Bounds:
    """The limits of every request of a push."""

    timeout_s: float  # each read, write or connect
    deadline_s: float  # a whole request that sends nothing; plus bytes sent / MIN_UPLOAD_RATE
    max_response_bytes: int  # what one answer may make us read


class _Budget:
    """The time one request has: ``deadline_s`` from its start, plus its upload allowance."""

    def __init__(self, deadline_s: float) -> None:
        self.start = time.monotonic()
        self.deadline_s = deadline_s
        self.sent = 0

    def left(self) -> float:
        return self.start + self.deadline_s + self.sent / MIN_UPLOAD_RATE - time.monotonic()


_local = threading.local()  # .budget: the _Budget of the request this thread is making


def bounded_client_factory(bounds: Bounds, default_factory: Callable[[], Any]) -> Callable[[], Any]:
    """A client factory for ``set_client_factory``: the library's default client, with our transport."""

    def factory() -> Any:
        default = default_factory()
        try:
            httpx, httpcore = _modules(default)
            transport = _transport_class(httpx, httpcore)
            mounts = {
                f"{scheme}://": transport(bounds, proxy=url)
                for scheme, url in _env_proxies().items()
                if url.startswith(("http://", "https://"))
            }
            return httpx.Client(
                event_hooks=default.event_hooks,
                follow_redirects=default.follow_redirects,
                timeout=httpx.Timeout(bounds.timeout_s, connect=min(bounds.timeout_s, 10.0)),
                transport=transport(bounds),
                mounts=mounts or None,
            )
        finally:
            default.close()

    return factory


def _modules(client: Any) -> tuple[ModuleType, ModuleType]:
    """httpx and httpcore as the library's client uses them (``httpx2``/``httpcore2`` for huggingface_hub 2.x)."""
    import importlib

    name = type(client).__module__.split(".")[0]
    return importlib.import_module(name), importlib.import_module(name.replace("httpx", "httpcore"))


def _env_proxies() -> dict[str, str]:
    """``http``/``https`` proxies from the environment, as the default client would use them.

    The client still adds its own mounts for the environment's proxies and ``NO_PROXY``
    exceptions; ours, mounted under the same keys, replace the proxying ones so that proxied
    requests are bounded too. (A SOCKS proxy keeps the library's transport: no deadline.)
    """
    import urllib.request  # here, not at the top: CLI start-up imports this module

    found = urllib.request.getproxies_environment()
    out = {scheme: found[scheme] for scheme in ("http", "https") if found.get(scheme)}
    if found.get("all"):
        for scheme in ("http", "https"):
            out.setdefault(scheme, found["all"])
    return out


_TRANSPORTS: dict[str, type] = {}


def _transport_class(httpx: ModuleType, httpcore: ModuleType) -> type:
    """The transport class for this httpx/httpcore pair (built once per pair, since it subclasses theirs)."""
    if httpx.__name__ in _TRANSPORTS:
        return _TRANSPORTS[httpx.__name__]

    deadline_error = type("RequestDeadlineExceeded", (httpx.TransportError, DeadlineExceeded), {})
    too_large_error = type("ResponseTooLargeError", (httpx.TransportError, ResponseTooLarge), {})
    core_errors = [
        (getattr(httpcore, name), getattr(httpx, name))
        for name in (
            "TimeoutException",
            "ConnectTimeout",
            "ReadTimeout",
            "WriteTimeout",
            "PoolTimeout",
            "NetworkError",
            "ConnectError",
            "ReadError",
            "WriteError",
            "ProxyError",
            "UnsupportedProtocol",
            "ProtocolError",
            "LocalProtocolError",
            "RemoteProtocolError",
        )
    ]

    def mapped(error: BaseException, request: Any) -> BaseException | None:
        """The httpx exception for ``error`` (None: not a transport error; let it through as it is)."""
        if isinstance(error, _Expired):
            out = deadline_error(f"no complete answer within {error.seconds:g} s", request=request)
            out.seconds = error.seconds
            return out
        if isinstance(error, _TooLarge):
            out = too_large_error(f"an answer larger than {error.limit} bytes", request=request)
            out.limit = error.limit
            return out
        best = None
        for core, ours in core_errors:
            if isinstance(error, core) and (best is None or issubclass(ours, best)):
                best = ours
        return None if best is None else best(str(error), request=request)

    class Body(httpx.SyncByteStream):  # type: ignore[misc,name-defined]
        """The response body, counted against the cap; read under its request's deadline."""

        def __init__(self, stream: Iterable[bytes], request: Any, budget: _Budget, limit: int) -> None:
            self._stream, self._request, self._budget, self._limit = stream, request, budget, limit

        def __iter__(self) -> Iterator[bytes]:
            seen = 0
            _local.budget = self._budget
            try:
                for chunk in self._stream:
                    seen += len(chunk)
                    if seen > self._limit:
                        raise _TooLarge(self._limit)
                    yield chunk
            except Exception as e:
                out = mapped(e, self._request)
                if out is None:
                    raise
                raise out from e

        def close(self) -> None:
            close = getattr(self._stream, "close", None)
            if close is not None:
                close()

    class Transport(httpx.BaseTransport):  # type: ignore[misc,name-defined]
        """httpx's HTTPTransport, on a network backend that enforces the deadline (see module doc)."""

        def __init__(self, bounds: Bounds, proxy: str | None = None) -> None:
            self._bounds = bounds
            backend = _Backend(httpcore)
            ssl_context = httpx.create_ssl_context()
            limits = {"max_connections": 100, "max_keepalive_connections": 20, "keepalive_expiry": 5.0}  # httpx's
            if proxy is None:
                self._pool = httpcore.ConnectionPool(ssl_context=ssl_context, network_backend=backend, **limits)
            else:
                via = httpx.Proxy(url=proxy)  # as httpx does: credentials in the URL become proxy auth
                self._pool = httpcore.HTTPProxy(
                    proxy_url=httpcore.URL(
                        scheme=via.url.raw_scheme, host=via.url.raw_host, port=via.url.port, target=via.url.raw_path
                    ),
                    proxy_auth=via.raw_auth,
                    proxy_headers=via.headers.raw,
                    ssl_context=ssl_context,
                    proxy_ssl_context=via.ssl_context,
                    network_backend=backend,
                    **limits,
                )

        def handle_request(self, request: Any) -> Any:
            budget = _Budget(self._bounds.deadline_s)
            _local.budget = budget
            core_request = httpcore.Request(
                method=request.method,
                url=httpcore.URL(
                    scheme=request.url.raw_scheme,
                    host=request.url.raw_host,
                    port=request.url.port,
                    target=request.url.raw_path,
                ),
                headers=request.headers.raw,
                content=request.stream,
                extensions=request.extensions,
            )
            try:
                response = self._pool.handle_request(core_request)
            except Exception as e:
                out = mapped(e, request)
                if out is None:
                    raise
                raise out from e
            limit = self._bounds.max_response_bytes
            length = _content_length(response.headers)
            if request.method != "HEAD" and length is not None and length > limit:
                response.close()
                raise mapped(_TooLarge(limit), request)  # type: ignore[misc]
            return httpx.Response(
                status_code=response.status,
                headers=response.headers,
                stream=Body(response.stream, request, budget, limit),
                extensions=response.extensions,
            )

        def close(self) -> None:
            self._pool.close()

    _TRANSPORTS[httpx.__name__] = Transport
    return Transport


class _Expired(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(f"no complete answer within {seconds:g} s")
        self.seconds = seconds


class _TooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"an answer larger than {limit} bytes")
        self.limit = limit


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for key, value in headers:
        if key.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _clamped(timeout: float | None) -> tuple[_Budget | None, float | None]:
    """The current request's budget, and ``timeout`` cut to the time it has left; raise when none is left."""
    budget: _Budget | None = getattr(_local, "budget", None)
    if budget is None:
        return None, timeout
    left = budget.left()
    if left <= 0:
        raise _Expired(budget.deadline_s)
    return budget, left if timeout is None else min(timeout, left)


class _Backend:
    """An httpcore network backend: the default sync one, with each stream wrapped in :class:`_Stream`."""

    def __init__(self, httpcore: ModuleType) -> None:
        self._inner = httpcore.SyncBackend()
        self._timeout_error: type[Exception] = httpcore.TimeoutException

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, **options: Any) -> _Stream:
        budget, timeout = _clamped(timeout)
        return _Stream(self._guard(budget, self._inner.connect_tcp, host, port, timeout, **options), self)

    def connect_unix_socket(self, path: str, timeout: float | None = None, **options: Any) -> _Stream:
        budget, timeout = _clamped(timeout)
        return _Stream(self._guard(budget, self._inner.connect_unix_socket, path, timeout, **options), self)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)

    def _guard(self, budget: _Budget | None, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call``, with a timeout that came from the deadline (not ``timeout_s``) reported as the deadline."""
        try:
            return call(*args, **kwargs)
        except self._timeout_error:
            if budget is not None and budget.left() <= 0.05:
                raise _Expired(budget.deadline_s) from None
            raise


class _Stream:
    """A network stream whose reads and writes never outlive the current request's deadline."""

    def __init__(self, inner: Any, backend: _Backend) -> None:
        self._inner, self._backend = inner, backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        budget, timeout = _clamped(timeout)
        return self._backend._guard(budget, self._inner.read, max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        view = memoryview(buffer)
        while view:
            budget, clamped = _clamped(timeout)
            piece = view[:MAX_WRITE]
            self._backend._guard(budget, self._inner.write, bytes(piece), clamped)
            if budget is not None:
                budget.sent += len(piece)
            view = view[MAX_WRITE:]

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> _Stream:
        budget, timeout = _clamped(timeout)
        inner = self._backend._guard(budget, self._inner.start_tls, ssl_context, server_hostname, timeout)
        return _Stream(inner, self._backend)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)
