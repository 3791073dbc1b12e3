"""serve's HTTP side on uvicorn's h11 protocol: the ASGI app and the limits every client meets.

uvicorn and h11 carry the protocol (parsing, keep-alive, pipelining one answer at a time, the
request-head size enforced as it arrives); this module adds what they leave to the application:
a deadline for a request head to arrive whole (slow clients), a send timeout for a client that
takes no answer off the server, and a cap on open connections. The app answers GET and HEAD from
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


def build_server(app: Any, limits: Limits, ssl_context: ssl.SSLContext | None = None) -> uvicorn.Server:
    """A uvicorn server for ``app`` with ``limits``; serve it with ``server.serve(sockets=[...])``."""
    config = uvicorn.Config(
        app, http=guarded_protocol(limits), lifespan="off", log_config=None, access_log=False,
        server_header=False, timeout_keep_alive=limits.idle_timeout_s,  # type: ignore[arg-type]
        h11_max_incomplete_event_size=limits.max_header_bytes, backlog=1024, timeout_graceful_shutdown=5,
        ssl_context_factory=(lambda _config, _default: ssl_context) if ssl_context is not None else None,
    )
    return uvicorn.Server(config)


def guarded_protocol(limits: Limits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a request-head deadline, a send timeout and a connection cap."""

    class Guarded(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _send_timer: asyncio.TimerHandle | None = None
        _parsed: object = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                log.warning("serve: %d connections open: closing a new one", len(self.connections) - 1)
                transport.close()
                return
            self._arm_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timers()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and self._waiting_for_head():
                self._arm_head()
            super().data_received(data)
            if self.cycle is not self._parsed:  # a whole request head arrived
                self._parsed = self.cycle
                self._cancel(self._head_timer)
                self._head_timer = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._waiting_for_head() and self.conn.trailing_data[0]:
                self._arm_head()  # part of the next request is already here: it must finish in time

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._send_timer is None:
                self._send_timer = self.loop.call_later(limits.send_timeout_s, self._drop, "send timeout")

        def resume_writing(self) -> None:
            super().resume_writing()
            self._cancel(self._send_timer)
            self._send_timer = None

        def _waiting_for_head(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm_head(self) -> None:
            self._cancel(self._head_timer)
            self._head_timer = self.loop.call_later(limits.header_timeout_s, self._drop, "request head timeout")

        def _drop(self, why: str) -> None:
            if not self.transport.is_closing():
                log.debug("serve: %s: closing the connection of %s", why, self.client)
                self.transport.abort()

        def _cancel_timers(self) -> None:
            self._cancel(self._head_timer)
            self._cancel(self._send_timer)
            self._head_timer = self._send_timer = None

        @staticmethod
        def _cancel(timer: asyncio.TimerHandle | None) -> None:
            if timer is not None:
                timer.cancel()

    return Guarded


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
        client = scope.get("client")
        access_log.debug('%s "%s %s HTTP/%s" %d %d', f"{client[0]}:{client[1]}" if client else "-",
                         scope["method"], request.path if request else origin_path(scope["raw_path"]).decode("latin-1"),
                         scope["http_version"],
                         reply.status, len(reply.body))

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
