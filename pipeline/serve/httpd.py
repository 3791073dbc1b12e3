"""A lean HTTP/1.1 server for ``faultwatch serve``: asyncio protocols, httptools' parser, keep-alive.

Every answer serve gives is already rendered to bytes by the refresh, so what a request costs is
the HTTP layer's own: aiohttp's took ~80-135 us of CPU per request here, this one ~30-50 us, about
what a trivial server answering the same bytes costs (docs/performance.md). It runs on asyncio's
loop: uvloop's was ~20 % faster, but under load it left newly accepted connections unanswered
for up to ~0.5 s. It serves GET and HEAD only (anything else is a 405), answers pipelined
requests in order, checks basic auth (bcrypt in a thread while the connection waits), bounds
request heads, stops reading from a client that does not read its answers, and closes
connections idle for ``idle_timeout_s``. TLS is asyncio's.
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
import http
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import httptools

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024


class Reply(NamedTuple):
    """One answer: status, Content-Type, body, and any other header lines (``Name: value\\r\\n``...)."""

    status: int
    content_type: bytes
    body: bytes
    headers: bytes = b""


class Request(NamedTuple):
    method: bytes
    path: str
    accept_gzip: bool


Handler = Callable[[Request], Reply]
Check = Callable[[str], bool]

_PHRASES = {s.value: s.phrase.encode() for s in http.HTTPStatus}
_TEXT = b"text/plain; charset=utf-8"


def _text(status: int, headers: bytes = b"") -> Reply:
    return Reply(status, _TEXT, b"%d: %s\n" % (status, _PHRASES[status]), headers)


class Auth(NamedTuple):
    """How requests are authenticated: ``known`` answers at once for headers seen valid before,
    ``verify`` is slow (bcrypt) and runs in a thread; ``denied(path)`` is the 401 answer."""

    known: Check
    verify: Check
    denied: Callable[[str], Reply]


class _Date:
    """The Date header's value, formatted once a second."""

    def __init__(self) -> None:
        self.second = -1
        self.value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self.second:
            self.second = second
            self.value = email.utils.formatdate(second, usegmt=True).encode()
        return self.value


class _Parsed:
    """What a request head says, as httptools' callbacks report it."""

    __slots__ = ("accept_gzip", "authorization", "head_bytes", "url")

    def __init__(self) -> None:
        self.url = b""
        self.authorization = ""
        self.accept_gzip = False
        self.head_bytes = 0


class HttpConnection(asyncio.Protocol):
    """One client connection; requests are answered in the order they came."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.current = _Parsed()
        self.queue: collections.deque[tuple[Request, str, bool]] = collections.deque()
        self.verifying = False  # a bcrypt check is running for the request at the head of the queue
        self.closing = False
        self.served = 0  # requests answered (the idle sweep compares it between sweeps)
        self.upgraded = False  # the client asked to switch protocols: close once answered

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)

    def pause_writing(self) -> None:  # the client does not read: stop reading its requests too
        if self.transport is not None and not self.closing:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closing and not self.verifying:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            self.parser.feed_data(data)
        except (ValueError, httptools.HttpParserError):  # httptools wraps a callback's exception
            self._fail(431 if self.current.head_bytes > MAX_HEAD_BYTES else 400)
        except httptools.HttpParserUpgrade:  # answered as a plain request; nothing after it is HTTP/1.1
            self._close_after_queue()

    # httptools callbacks

    def on_message_begin(self) -> None:
        self.current = _Parsed()

    def on_url(self, url: bytes) -> None:
        p = self.current
        p.url += url
        p.head_bytes += len(url)
        if p.head_bytes > MAX_HEAD_BYTES:
            raise ValueError("request head too large")  # ends the parse: a 431

    def on_header(self, name: bytes, value: bytes) -> None:
        p = self.current
        p.head_bytes += len(name) + len(value) + 4
        if p.head_bytes > MAX_HEAD_BYTES:
            raise ValueError("request head too large")  # ends the parse: a 431
        lower = name.lower()
        if lower == b"accept-encoding":
            p.accept_gzip = p.accept_gzip or b"gzip" in value.lower()
        elif lower == b"authorization":
            p.authorization = value.decode("latin-1")

    def on_message_complete(self) -> None:
        p = self.current
        url = p.url.decode("latin-1")
        path = url.partition("?")[0]  # still percent-encoded: names are decoded segment by segment
        request = Request(self.parser.get_method(), path, p.accept_gzip)
        self.queue.append((request, p.authorization, self.parser.should_keep_alive()))
        if not self.verifying:
            self._answer_queued()

    # answering

    def _answer_queued(self) -> None:
        auth = self.server.auth
        while self.queue and not self.closing:
            request, authorization, keep_alive = self.queue[0]
            if auth is not None and not (authorization and auth.known(authorization)):
                if authorization:  # not seen valid before: bcrypt, in a thread; reading waits
                    self._verify(authorization)
                    return
                reply = auth.denied(request.path)
            else:
                reply = self.server.answer(request)
            self.queue.popleft()
            self._write(request, reply, keep_alive)

    def _verify(self, authorization: str) -> None:
        assert self.transport is not None and self.server.auth is not None
        self.verifying = True
        self.transport.pause_reading()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, self.server.auth.verify, authorization)
        future.add_done_callback(self._verified)

    def _verified(self, future: asyncio.Future[bool]) -> None:
        self.verifying = False
        if self.closing or not self.queue:
            return
        request, _, keep_alive = self.queue.popleft()
        ok = not future.cancelled() and future.exception() is None and future.result()
        assert self.server.auth is not None
        self._write(request, self.server.answer(request) if ok else self.server.auth.denied(request.path), keep_alive)
        self._answer_queued()
        if not self.verifying and not self.closing and self.transport is not None:
            self.transport.resume_reading()

    def _write(self, request: Request, reply: Reply, keep_alive: bool) -> None:
        transport = self.transport
        assert transport is not None
        status, content_type, body, extra = reply
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n%s%s\r\n" % (
            status, _PHRASES.get(status, b""), content_type, len(body), self.server.date.now(), extra,
            b"" if keep_alive else b"Connection: close\r\n",
        )
        if request.method == b"HEAD":
            transport.write(head)
        elif len(body) < 65536:
            transport.write(head + body)
        else:
            transport.writelines((head, body))
        self.served += 1
        if not keep_alive or (self.upgraded and not self.queue):
            self.closing = True
            transport.close()

    def _close_after_queue(self) -> None:
        self.upgraded = True
        if not self.queue and self.transport is not None and not self.closing:
            self.closing = True
            self.transport.close()

    def _fail(self, status: int) -> None:
        """A request that cannot be parsed: answer it and close."""
        self.queue.clear()
        if self.transport is not None and not self.closing:
            self._write(Request(b"GET", "", False), _text(status), keep_alive=False)

    def idle_close(self) -> None:
        if self.transport is not None and not self.closing:
            self.closing = True
            self.transport.close()


class HttpServer:
    """Listens and answers with ``answer(request)``; :meth:`stop` closes every connection."""

    def __init__(self, answer: Handler, auth: Auth | None = None, idle_timeout_s: float = 75.0) -> None:
        self.answer = self._guarded(answer)
        self.auth = auth
        self.date = _Date()
        self.idle_timeout_s = idle_timeout_s
        self.connections: set[HttpConnection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None

    @staticmethod
    def _guarded(answer: Handler) -> Handler:
        def guarded(request: Request) -> Reply:
            if request.method not in (b"GET", b"HEAD"):
                return _text(405, b"Allow: GET, HEAD\r\n")
            try:
                return answer(request)
            except Exception:
                log.exception("serve: answering %s failed", request.path)
                return _text(500)

        return guarded

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpConnection(self), host, port, ssl=ssl_context, backlog=1024, reuse_address=True
        )
        self._sweeper = loop.create_task(self._sweep())
        sockname: Any = self._server.sockets[0].getsockname()
        return sockname[0], sockname[1]

    async def _sweep(self) -> None:
        """Closes connections that asked nothing for ``idle_timeout_s`` (and have nothing to read)."""
        period = max(self.idle_timeout_s / 5, 0.05)
        seen: dict[HttpConnection, tuple[int, int]] = {}
        while True:
            await asyncio.sleep(period)
            now = {}
            for conn in list(self.connections):
                served, quiet = seen.get(conn, (-1, 0))
                busy = conn.verifying or (conn.transport is not None and conn.transport.get_write_buffer_size() > 0)
                quiet = quiet + 1 if conn.served == served and not busy else 0
                if quiet >= 5:
                    conn.idle_close()
                else:
                    now[conn] = (conn.served, quiet)
            seen = now

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.idle_close()
        if self._server is not None:
            await self._server.wait_closed()

