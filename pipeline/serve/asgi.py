"""serve's HTTP side on uvicorn (httptools, or h11): the ASGI app and the limits every client meets.

uvicorn carries the protocol (parsing, keep-alive, pipelined requests answered one at a time);
this module adds what it leaves to the application: a deadline for a request head to arrive whole
(slow clients), a send timeout for a client that takes no answer off the server, a cap on open
connections, and, on httptools, the request-head size bound while it arrives (h11 has its own) and
a bound on requests queued behind the answer in flight. The app answers GET and HEAD from
the snapshot the refresh rendered, so a request never waits for the tables.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)
access_log = logging.getLogger("pipeline.serve.access")


class Reply(NamedTuple):
    """One answer: status, Content-Type, body, and any other headers."""

    status: int
    content_type: bytes
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()


class Request(NamedTuple):
    method: bytes
    path: str  # still percent-encoded, without the query
    accept_gzip: bool


@dataclass(frozen=True)
class Limits:
    """What one client may hold (``[serve]`` in conf/faultwatch.toml)."""

    max_header_bytes: int = 16384
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0
    send_timeout_s: float = 30.0
    max_connections: int = 1000


HTTP_PROTOCOLS = ("httptools", "h11")


def build_server(app: Any, limits: Limits, ssl_context: ssl.SSLContext | None = None,
                 http: str = "httptools") -> uvicorn.Server:
    """A uvicorn server for ``app`` with ``limits`` on ``http`` (one of :data:`HTTP_PROTOCOLS`);
    serve it with ``server.serve(sockets=[...])``."""
    protocol = {"httptools": guarded_httptools, "h11": guarded_h11}[http](limits)
    config = uvicorn.Config(
        app, http=protocol, lifespan="off", log_config=None, access_log=False,
        server_header=False, timeout_keep_alive=limits.idle_timeout_s,  # type: ignore[arg-type]
        h11_max_incomplete_event_size=limits.max_header_bytes, backlog=1024, timeout_graceful_shutdown=5,
        ssl_context_factory=(lambda _config, _default: ssl_context) if ssl_context is not None else None,
    )
    return uvicorn.Server(config)


class _Guards:
    """What both protocols add: a connection cap, a request-head deadline, a send timeout.

    Mixed in before uvicorn's protocol class, whose ``transport``, ``loop``, ``connections`` and
    ``client`` it uses.
    """

    limits: Limits
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    connections: set[Any]
    client: Any
    _head_timer: asyncio.TimerHandle | None = None
    _send_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        if len(self.connections) > self.limits.max_connections:
            log.warning("serve: %d connections open: closing a new one", len(self.connections) - 1)
            transport.close()
            return
        self._arm_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)  # type: ignore[misc]

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout_s, self._drop, "send timeout")

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        _cancel(self._send_timer)
        self._send_timer = None

    def _arm_head(self) -> None:
        _cancel(self._head_timer)
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._drop, "request head timeout")

    def _head_arrived(self) -> None:
        _cancel(self._head_timer)
        self._head_timer = None

    def _drop(self, why: str) -> None:
        if not self.transport.is_closing():
            log.debug("serve: %s: closing the connection of %s", why, self.client)
            self.transport.abort()

    def _cancel_timers(self) -> None:
        _cancel(self._head_timer)
        _cancel(self._send_timer)
        self._head_timer = self._send_timer = None


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()


def guarded_h11(limits: Limits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the guards; h11 itself bounds a request head while it arrives."""

    class GuardedH11(_Guards, H11Protocol):
        _parsed: object = None

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and self._waiting_for_head():
                self._arm_head()
            super().data_received(data)
            if self.cycle is not self._parsed:  # a whole request head arrived
                self._parsed = self.cycle
                self._head_arrived()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._waiting_for_head() and self.conn.trailing_data[0]:
                self._arm_head()  # part of the next request is already here: it must finish in time

        def _waiting_for_head(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

    GuardedH11.limits = limits
    return GuardedH11


# Requests one connection may queue behind the answer in flight; a client pipelining deeper is dropped
# (httptools parses a whole read at once, so each queued request holds its parsed head meanwhile).
MAX_PIPELINED = 32
_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
              b"Content-Length: 37\r\nConnection: close\r\n\r\n431: Request Header Fields Too Large\n")


def guarded_httptools(limits: Limits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the guards, a request-head size bound and a pipelining bound.

    httptools keeps a header value that has not ended without telling anyone, so the bytes read
    while a head is incomplete are counted here: once they pass ``max_header_bytes`` the client
    gets a 431 and the connection is closed. (Of a read in which another head ended, the new
    head's share is unknown and not counted; :class:`App` measures every whole head exactly.)
    """

    class GuardedHttpTools(_Guards, HttpToolsProtocol):
        _in_head = False
        _head_bytes = 0  # read while this head is incomplete
        _heads_done = 0  # heads completed in the read being parsed
        _dropped = False

        def data_received(self, data: bytes) -> None:
            self._heads_done = 0
            super().data_received(data)
            if self._in_head and not self._heads_done and not self._dropped:
                self._head_bytes += len(data)
                if self._head_bytes > self.limits.max_header_bytes and not self.transport.is_closing():
                    log.debug("serve: a request head of %s passed %d bytes", self.client, self.limits.max_header_bytes)
                    self._dropped = True
                    if self.pipeline or not (self.cycle is None or self.cycle.response_complete):
                        self.transport.abort()  # an answer is still going out: no room for a 431
                    else:
                        self.transport.write(_TOO_LARGE)
                        self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head, self._head_bytes = True, 0
            if self._head_timer is None:
                self._arm_head()

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._heads_done += 1
            self._head_arrived()
            if self._dropped:
                return
            if len(self.pipeline) >= MAX_PIPELINED:
                log.debug("serve: %s pipelined over %d requests: closing after their answers", self.client,
                          MAX_PIPELINED)
                self._dropped = True
                self.pipeline[0][0].keep_alive = False  # the newest queued: the connection closes after it
                return
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._in_head:
                self._arm_head()  # the next head began while this answer was out: its time starts now

    GuardedHttpTools.limits = limits
    return GuardedHttpTools


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Handler = Callable[[Request], Reply]
AuthCheck = Callable[[str, str], Awaitable[bool]]

_TEXT = b"text/plain; charset=utf-8"


def text(status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> Reply:
    return Reply(status, _TEXT, f"{status}: {message}\n".encode(), headers)


def accepts_gzip(value: bytes) -> bool:
    """Whether an Accept-Encoding value allows gzip (``gzip;q=0`` refuses it)."""
    for item in value.lower().split(b","):
        coding, _, params = item.strip().partition(b";")
        if coding.strip() not in (b"gzip", b"*"):
            continue
        q = 1.0
        for param in params.split(b";"):
            name, _, val = param.strip().partition(b"=")
            if name.strip() == b"q":
                try:
                    q = float(val.strip())
                except ValueError:
                    q = 0.0
        return q > 0
    return False


def origin_path(target: bytes) -> bytes:
    """The path of a request target, absolute-form (``http://host/x``) included."""
    for scheme in (b"http://", b"https://"):
        if target[: len(scheme)].lower() == scheme:
            slash = target.find(b"/", len(scheme))
            return target[slash:] if slash >= 0 else b"/"
    return target


class App:
    """The ASGI application: header checks, basic auth, then ``answer(request)``."""

    def __init__(self, answer: Handler, auth: AuthCheck | None = None, denied: Callable[[str], Reply] | None = None,
                 max_header_bytes: int = 16384):
        self.answer = answer
        self.auth = auth
        self.denied = denied
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        reply, request = await self._reply(scope)
        await self._send(send, scope["method"] == "HEAD", reply)
        if access_log.isEnabledFor(logging.DEBUG):  # `faultwatch -v serve`
            client = scope.get("client")
            access_log.debug('%s "%s %s HTTP/%s" %d %d', f"{client[0]}:{client[1]}" if client else "-",
                             scope["method"], request.path if request else origin_path(scope["raw_path"]).decode("latin-1"),
                             scope["http_version"], reply.status, len(reply.body))

    async def _reply(self, scope: Scope) -> tuple[Reply, Request | None]:
        counts: dict[bytes, int] = {}
        values: dict[bytes, bytes] = {}
        size = len(scope["raw_path"]) + len(scope["query_string"])
        for name, value in scope["headers"]:
            size += len(name) + len(value) + 4
            if name in (b"host", b"authorization", b"accept-encoding"):
                counts[name] = counts.get(name, 0) + 1
                values[name] = value
        # h11 refuses a head that grows past the limit while it arrives; one that came whole in a
        # single read is refused here.
        if size > self.max_header_bytes:
            return text(431, "Request Header Fields Too Large"), None
        if scope["http_version"] == "1.1" and counts.get(b"host", 0) != 1:
            return text(400, "HTTP/1.1 needs exactly one Host header"), None
        if counts.get(b"authorization", 0) > 1:
            return text(400, "more than one Authorization header"), None
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            return text(405, "Method Not Allowed", ((b"Allow", b"GET, HEAD"),)), None
        path = origin_path(scope["raw_path"]).decode("latin-1")
        request = Request(method.encode(), path, accepts_gzip(values.get(b"accept-encoding", b"")))
        if self.auth is not None:
            authorization = values.get(b"authorization", b"").decode("latin-1")
            client = scope.get("client")
            if not (authorization and await self.auth(authorization, client[0] if client else "-")):
                assert self.denied is not None
                return self.denied(path), request
        try:
            return self.answer(request), request
        except Exception:
            log.exception("serve: answering %s failed", path)
            return text(500, "Internal Server Error"), request

    @staticmethod
    async def _send(send: Send, head_only: bool, reply: Reply) -> None:
        status, content_type, body, extra = reply
        headers = [(b"Content-Type", content_type), (b"Content-Length", str(len(body)).encode()), *extra]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if head_only else body})
