"""The HTTP side of ``faultwatch serve``: routes, basic auth, TLS, start and stop.

Handlers only look up the current snapshot and return bytes the refresh already rendered, so
they take microseconds and never wait for the tables; uvicorn's h11 protocol, with the limits of
:mod:`pipeline.serve.asgi`, is the HTTP layer under them. Only GET (and HEAD) are answered: the
API is read-only and anything else is a 405.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import gc
import hashlib
import hmac
import logging
import re
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import unquote

import orjson
import uvicorn
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from pipeline.config import Config, ConfigError
from pipeline.serve import api
from pipeline.serve.asgi import App, Limits, Reply, Request, build_server
from pipeline.serve.snapshot import health
from pipeline.serve.state import ServeState
from pipeline.serve.worker import Published, RefreshWorker

log = logging.getLogger(__name__)

_JSON = b"application/json"
_HTML = b"text/html; charset=utf-8"
_METRICS = CONTENT_TYPE_PLAIN_0_0_4.encode()
_TEXT = b"text/plain; charset=utf-8"
_NOT_READY = Reply(503, _TEXT, b"no refresh of the tables has finished yet\n")
_NOT_FOUND = Reply(404, _TEXT, b"404: Not Found\n")
_VARY = ((b"Vary", b"Accept-Encoding"),)
_GZIP = ((b"Content-Encoding", b"gzip"), *_VARY)


def _json(answer: api.Answer) -> Reply:
    status, body = answer
    return Reply(status, _JSON, body)


class BasicAuth:
    """Checks ``Authorization: Basic`` against one user and a bcrypt hash.

    bcrypt is slow on purpose (tens of ms), so every header's verdict is remembered by its SHA-256
    (as Prometheus' exporter-toolkit does for good ones), failures included, and bcrypt runs for
    one header at a time: a flood of wrong passwords costs at most one core and never the loop.
    """

    def __init__(self, username: str, password_hash: str, max_cached: int = 64, max_failed: int = 4096) -> None:
        self._username = username.encode()
        self._hash = password_hash.encode()
        self._good: dict[bytes, None] = {}
        self._bad: dict[bytes, None] = {}
        self._max_cached = max_cached
        self._max_failed = max_failed
        self._lock: asyncio.Lock | None = None

    def known(self, header: str) -> bool:
        """True when this header checked out before (no bcrypt)."""
        return hashlib.sha256(header.encode()).digest() in self._good

    async def check(self, header: str, client: str = "-") -> bool:
        digest = hashlib.sha256(header.encode()).digest()
        if digest in self._good:
            return True
        if digest in self._bad:
            return False
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one bcrypt at a time
            if digest in self._good or digest in self._bad:
                return digest in self._good
            ok = await asyncio.get_running_loop().run_in_executor(None, self.verify, header)
        cache, bound = (self._good, self._max_cached) if ok else (self._bad, self._max_failed)
        if len(cache) >= bound:
            cache.pop(next(iter(cache)))
        cache[digest] = None
        if not ok:
            log.info("serve: failed login from %s (user %r)", client, self._user_of(header)[:64])
        return ok

    @staticmethod
    def _user_of(header: str) -> str:
        try:
            return base64.b64decode(header.partition(" ")[2], validate=True).partition(b":")[0].decode("latin-1")
        except (binascii.Error, ValueError):
            return "?"

    def verify(self, header: str) -> bool:
        import bcrypt

        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        user_ok = hmac.compare_digest(user, self._username)
        password_ok = bool(sep) and bcrypt.checkpw(password, self._hash)
        return user_ok and password_ok

    @staticmethod
    def denied(path: str) -> Reply:
        challenge = ((b"WWW-Authenticate", b'Basic realm="faultwatch", charset="UTF-8"'),)
        return _json(api.reply(401, path, "unauthorized"))._replace(headers=challenge)


_P = re.escape(api.API_PREFIX)
_SEGMENT = r"([^{}/]+)"  # what a route's {name} matched before
_API_ROUTES: tuple[tuple[re.Pattern[str], Callable[..., api.Answer]], ...] = (
    (re.compile(_P), api.clusters),
    (re.compile(rf"{_P}/{_SEGMENT}"), api.cluster),
    (re.compile(rf"{_P}/{_SEGMENT}/consumer"), api.consumers),
    (re.compile(rf"{_P}/{_SEGMENT}/consumer/{_SEGMENT}/status"), api.group_status),
    (re.compile(rf"{_P}/{_SEGMENT}/broker"), api.brokers),
    (re.compile(rf"{_P}/{_SEGMENT}/avoidance"), lambda s, path, name: api.avoidance(s, path, name, {})),
)


class Routes:
    """Request handlers over the refresher's current snapshot."""

    def __init__(self, cfg: Config, refresher: RefreshWorker, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.refresher = refresher
        self.clock = clock
        p = api.API_PREFIX
        self._fixed = {"/": self.page, "/metrics": self.metrics, "/healthz": self.healthz}
        self._api_prefix, self._api_root = p + "/", p

    def answer(self, request: Request) -> Reply:
        snap = self.refresher.snapshot
        if snap is not None:  # the common case first: an answer the refresh rendered, asked for as rendered
            answer = snap.answers.get(request.path)
            if answer is not None:
                return Reply(answer[0], _JSON, answer[1])
        path = api.canonical_path(request.path)
        if snap is not None and path != request.path:
            answer = snap.answers.get(path)
            if answer is not None:
                return Reply(answer[0], _JSON, answer[1])
        fixed = self._fixed.get(path)
        if fixed is not None:
            return fixed(request, snap)
        if path == self._api_root or path.startswith(self._api_prefix):
            return self._api(path, snap)
        return _NOT_FOUND

    def metrics(self, request: Request, snap: Published | None) -> Reply:
        if snap is None:
            return _NOT_READY
        if request.accept_gzip:
            return Reply(200, _METRICS, snap.metrics_gzip, _GZIP)
        return Reply(200, _METRICS, snap.metrics, _VARY)

    def page(self, request: Request, snap: Published | None) -> Reply:
        return _NOT_READY if snap is None else Reply(200, _HTML, snap.page)

    def healthz(self, request: Request, snap: Published | None) -> Reply:
        status, reasons = health(snap, self.cfg, int(self.clock() * 1000))
        body = {"status": "ok" if status == 200 else "unhealthy", "reasons": reasons}
        return Reply(status, _JSON, orjson.dumps(body))

    def _api(self, path: str, snap: Published | None) -> Reply:
        """Paths the refresh did not render: unknown clusters and groups (404) or tables in error (503)."""
        if snap is None:
            return _json(api.reply(503, path, "no refresh of the tables has finished yet"))
        state: ServeState = snap.state
        for pattern, render in _API_ROUTES:
            match = pattern.fullmatch(path)
            if match:
                return _json(render(state, path, *(unquote(g) for g in match.groups())))
        return _json(api.not_found(path, "resource"))


def _event_loop_run(name: str) -> Callable[[Coroutine[Any, Any, None]], None]:
    """``asyncio.run`` on the event loop ``serve.loop`` names."""
    if name == "asyncio":
        return asyncio.run
    try:
        import uvloop
    except ImportError:
        raise ConfigError("serve.loop = 'uvloop' needs the uvloop package (not on Windows): "
                          "install it or set serve.loop = 'asyncio'") from None
    return uvloop.run


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


# asyncio's TLS transport (serve.loop = "asyncio") allocates and zero-fills a read buffer of
# SSLProtocol.max_size, 256 KiB, for every accepted connection, before its handshake: ~80 MB for 300
# silent connections. A TLS record carries at most 16 KiB, so 32 KiB reads lose nothing. (uvloop's
# mallocs its buffer without touching it: the pages become resident only as data arrives.)
_TLS_READ_BUFFER = 32 * 1024


def _bound_tls_buffers() -> None:
    from asyncio import sslproto

    if getattr(sslproto.SSLProtocol, "max_size", 0) > _TLS_READ_BUFFER:
        setattr(sslproto.SSLProtocol, "max_size", _TLS_READ_BUFFER)  # noqa: B010 - not in the stubs


def ssl_context(cfg: Config) -> ssl.SSLContext | None:
    s = cfg.serve
    if s.tls_cert_file is None or s.tls_key_file is None:
        return None
    _bound_tls_buffers()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(s.tls_cert_file, s.tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"serve.tls_cert_file / serve.tls_key_file: cannot load: {exc}") from None
    return ctx


def _freeze_startup_heap() -> None:
    """Move every object alive at start-up (modules, classes, the config: ~90,000 of them) out of
    the collector's reach. A full collection scans every tracked object with the GIL held; with
    them it took 35-90 ms and ran about once a second under load (each one a stall of every request
    in flight), without them it scans only what serving and the current snapshot created."""
    gc.collect()
    gc.freeze()


class Server:
    """serve's HTTP server and refresher, in a thread of its own (:meth:`start`) or in the
    calling thread (:meth:`run`)."""

    def __init__(self, cfg: Config, port: int | None = None) -> None:
        self.cfg = cfg
        self.port = cfg.serve.port if port is None else port
        self.refresher = RefreshWorker(cfg)
        self.ssl = ssl_context(cfg)
        self.url: str | None = None
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _uvicorn(self) -> uvicorn.Server:
        s = self.cfg.serve
        auth = None
        if s.basic_auth_username is not None and s.basic_auth_password_hash is not None:
            auth = BasicAuth(s.basic_auth_username, s.basic_auth_password_hash.value)
        app = App(Routes(self.cfg, self.refresher).answer, auth.check if auth else None, BasicAuth.denied,
                  s.max_header_bytes)
        limits = Limits(s.max_header_bytes, s.header_timeout_s, s.idle_timeout_s, s.send_timeout_s, s.max_connections)
        return build_server(app, limits, self.ssl, s.http)

    async def _serve(self, on_ready: Callable[[str], None] | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if threading.current_thread() is threading.main_thread():  # `faultwatch serve`: stop cleanly
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._stopping.set)
        s = self.cfg.serve
        sock = socket.create_server((s.host, self.port), family=_family(s.host), backlog=1024)
        server = self._uvicorn()
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("the HTTP server stopped while starting")
                await asyncio.sleep(0.01)
            host, port = sock.getsockname()[:2]
            scheme = "https" if self.ssl else "http"
            self.url = f"{scheme}://{host}:{port}/" if ":" not in host else f"{scheme}://[{host}]:{port}/"
            log.debug("serve: HTTP on %s:%d%s", host, port, " over TLS" if self.ssl else "")
            if threading.current_thread() is threading.main_thread():
                _freeze_startup_heap()
            self.refresher.start()
            self._ready.set()
            if on_ready is not None:
                on_ready(self.url)
            await self._stopping.wait()
        finally:
            self.refresher.stop()
            server.should_exit = True
            await task
            sock.close()

    def run(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Serve until :meth:`stop` (or Ctrl-C, SIGTERM)."""
        _event_loop_run(self.cfg.serve.loop)(self._serve(on_ready))

    def start(self, timeout_s: float = 30.0) -> str:
        """Serve in a daemon thread; returns the URL once it listens."""

        def target() -> None:
            try:
                self.run()
            except BaseException as exc:  # noqa: BLE001 - surfaced by start()
                self._error = exc
                self._ready.set()

        self._thread = threading.Thread(target=target, name="faultwatch-serve", daemon=True)
        self._thread.start()
        self._ready.wait(timeout_s)
        if self._error is not None:
            raise self._error
        if self.url is None:
            raise RuntimeError("serve did not start listening in time")
        return self.url

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(timeout=30)
