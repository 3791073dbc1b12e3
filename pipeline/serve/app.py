"""The HTTP side of ``faultwatch serve`` (aiohttp): routes, basic auth, TLS, start and stop.

Handlers only look up the current snapshot and return bytes rendered from it, so they take
microseconds and never wait for the tables. Only GET (and HEAD) routes exist: the API is
read-only and anything else is a 405.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import signal
import ssl
import threading
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from pipeline.config import Config, ConfigError
from pipeline.serve import api
from pipeline.serve.snapshot import health
from pipeline.serve.state import ServeState
from pipeline.serve.worker import Published, RefreshWorker

log = logging.getLogger(__name__)

_JSON = "application/json"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(answer: api.Answer) -> web.Response:
    status, body = answer
    return web.Response(status=status, body=body, content_type=_JSON)


class BasicAuth:
    """Checks ``Authorization: Basic`` against one user and a bcrypt hash.

    bcrypt is slow on purpose (tens of ms), so a header that checked out once is remembered by its
    SHA-256 (as Prometheus' exporter-toolkit does); failures are not remembered.
    """

    def __init__(self, username: str, password_hash: str, max_cached: int = 64) -> None:
        self._username = username.encode()
        self._hash = password_hash.encode()
        self._good: dict[bytes, None] = {}
        self._max_cached = max_cached

    def check(self, header: str) -> bool:
        digest = hashlib.sha256(header.encode()).digest()
        if digest in self._good:
            return True
        if not self._verify(header):
            return False
        if len(self._good) >= self._max_cached:
            self._good.pop(next(iter(self._good)))
        self._good[digest] = None
        return True

    def _verify(self, header: str) -> bool:
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


def _auth_middleware(auth: BasicAuth) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        if header and await asyncio.get_running_loop().run_in_executor(None, auth.check, header):
            return await handler(request)
        response = _json(api.reply(401, request.path, "unauthorized"))
        response.headers["WWW-Authenticate"] = 'Basic realm="faultwatch", charset="UTF-8"'
        return response

    return middleware


class Routes:
    """Request handlers over the refresher's current snapshot."""

    def __init__(self, cfg: Config, refresher: RefreshWorker, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.refresher = refresher
        self.clock = clock

    def _snapshot(self) -> Published | None:
        return self.refresher.snapshot

    async def metrics(self, request: web.Request) -> web.Response:
        snap = self._snapshot()
        if snap is None:
            return web.Response(status=503, text="no refresh of the tables has finished yet\n")
        headers = {"Content-Type": CONTENT_TYPE_PLAIN_0_0_4, "Vary": "Accept-Encoding"}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            return web.Response(body=snap.metrics_gzip, headers={**headers, "Content-Encoding": "gzip"})
        return web.Response(body=snap.metrics, headers=headers)

    async def page(self, request: web.Request) -> web.Response:
        snap = self._snapshot()
        if snap is None:
            return web.Response(status=503, text="no refresh of the tables has finished yet\n")
        return web.Response(body=snap.page, content_type="text/html", charset="utf-8")

    async def healthz(self, request: web.Request) -> web.Response:
        status, reasons = health(self._snapshot(), self.cfg, int(self.clock() * 1000))
        body = {"status": "ok" if status == 200 else "unhealthy", "reasons": reasons}
        return web.json_response(body, status=status)

    def _api(self, request: web.Request, render: Callable[[ServeState], api.Answer]) -> web.Response:
        """The answer the refresh rendered for this path; unknown paths get theirs (404, 503) here."""
        snap = self._snapshot()
        if snap is None:
            return _json(api.reply(503, request.path, "no refresh of the tables has finished yet"))
        answer = snap.answers.get(request.path)
        return _json(answer if answer is not None else render(snap.state))

    async def clusters(self, request: web.Request) -> web.Response:
        return self._api(request, lambda s: api.clusters(s, request.path))

    async def cluster(self, request: web.Request) -> web.Response:
        name = request.match_info["cluster"]
        return self._api(request, lambda s: api.cluster(s, request.path, name))

    async def consumers(self, request: web.Request) -> web.Response:
        name = request.match_info["cluster"]
        return self._api(request, lambda s: api.consumers(s, request.path, name))

    async def group_status(self, request: web.Request) -> web.Response:
        name, group = request.match_info["cluster"], request.match_info["group"]
        return self._api(request, lambda s: api.group_status(s, request.path, name, group))

    async def brokers(self, request: web.Request) -> web.Response:
        name = request.match_info["cluster"]
        return self._api(request, lambda s: api.brokers(s, request.path, name))

    async def avoidance(self, request: web.Request) -> web.Response:
        name = request.match_info["cluster"]
        return self._api(request, lambda s: api.avoidance(s, request.path, name, {}))

    async def unknown_api(self, request: web.Request) -> web.Response:
        return _json(api.not_found(request.path, "resource"))


def build_app(cfg: Config, refresher: RefreshWorker) -> web.Application:
    s = cfg.serve
    middlewares = []
    if s.basic_auth_username is not None and s.basic_auth_password_hash is not None:
        middlewares.append(_auth_middleware(BasicAuth(s.basic_auth_username, s.basic_auth_password_hash.value)))
    app = web.Application(middlewares=middlewares)
    r = Routes(cfg, refresher)
    p = api.API_PREFIX
    app.add_routes([
        web.get("/", r.page),
        web.get("/metrics", r.metrics),
        web.get("/healthz", r.healthz),
        web.get(p, r.clusters),
        web.get(p + "/{cluster}", r.cluster),
        web.get(p + "/{cluster}/consumer", r.consumers),
        web.get(p + "/{cluster}/consumer/{group}/status", r.group_status),
        web.get(p + "/{cluster}/broker", r.brokers),
        web.get(p + "/{cluster}/avoidance", r.avoidance),
        web.get(p + "/{tail:.*}", r.unknown_api),
    ])
    return app


def ssl_context(cfg: Config) -> ssl.SSLContext | None:
    s = cfg.serve
    if s.tls_cert_file is None or s.tls_key_file is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(s.tls_cert_file, s.tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"serve.tls_cert_file / serve.tls_key_file: cannot load: {exc}") from None
    return ctx


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

    async def _serve(self, on_ready: Callable[[str], None] | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if threading.current_thread() is threading.main_thread():  # `faultwatch serve`: stop cleanly
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._stopping.set)
        runner = web.AppRunner(build_app(self.cfg, self.refresher), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.cfg.serve.host, self.port, ssl_context=self.ssl, backlog=1024)
            await site.start()
            host, port = runner.addresses[0][:2]
            scheme = "https" if self.ssl else "http"
            self.url = f"{scheme}://{host}:{port}/"
            self.refresher.start()
            self._ready.set()
            if on_ready is not None:
                on_ready(self.url)
            await self._stopping.wait()
        finally:
            self.refresher.stop()
            await runner.cleanup()

    def run(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Serve until :meth:`stop` (or Ctrl-C)."""
        asyncio.run(self._serve(on_ready))

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
