"""serve's HTTP layer (pipeline/serve/httpd.py) over real sockets: keep-alive, HEAD, pipelining in
order, 405/400/431, paths left percent-encoded, basic auth through bcrypt, idle connections closed."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import bcrypt
import pytest

from pipeline.serve.app import BasicAuth
from pipeline.serve.httpd import HttpServer, Reply, Request


def answer(request: Request) -> Reply:
    if request.path == "/boom":
        raise RuntimeError("a bug in a handler")
    body = f"{request.method.decode()} {request.path} gzip={request.accept_gzip}".encode()
    return Reply(200, b"text/plain", body, b"X-Test: 1\r\n")


class Running:
    """An :class:`HttpServer` on its own loop in a thread, on a free loopback port."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.port = 0

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            _, self.port = self.loop.run_until_complete(server.start("127.0.0.1", 0, None))
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def start(**kw: Any) -> Running:
    return Running(HttpServer(answer, **kw))


@pytest.fixture
def plain() -> Iterator[Running]:
    running = start()
    yield running
    running.close()


class Client:
    """A raw socket that reads answers one at a time (pipelined answers stay buffered)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {self.buf!r}")
        self.buf += chunk


@contextlib.contextmanager
def connect(port: int) -> Iterator[Client]:
    client = Client(port)
    try:
        yield client
    finally:
        client.sock.close()


def read_answer(c: Client, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
    """One answer: status, headers (lower-case names), body."""
    while b"\r\n\r\n" not in c.buf:
        c._fill()
    head, _, c.buf = c.buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = 0 if head_only else int(headers["content-length"])
    while len(c.buf) < length:
        c._fill()
    body, c.buf = c.buf[:length], c.buf[length:]
    return status, headers, body


def closed(c: Client) -> bool:
    c.sock.settimeout(5)
    try:
        return not c.buf and c.sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_keep_alive_head_and_query_strings(plain: Running) -> None:
    with connect(plain.port) as s:
        s.sendall(b"HEAD /a?x=1 HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip, br\r\n\r\n")
        status, headers, body = read_answer(s, head_only=True)
        assert status == 200 and body == b"" and headers["content-length"] == str(len(b"HEAD /a gzip=True"))
        assert headers["x-test"] == "1" and headers["content-type"] == "text/plain" and "date" in headers
        for _ in range(3):  # the same connection goes on
            s.sendall(b"GET /v3/a%20b/c%2Fd?y HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(s)[::2] == (200, b"GET /v3/a%20b/c%2Fd gzip=False")  # decoded by the routes


def test_pipelined_requests_are_answered_in_order_and_close_ends_it(plain: Running) -> None:
    with connect(plain.port) as s:
        s.sendall(b"".join(b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(50))
                  + b"GET /last HTTP/1.1\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\n\r\n")
        for i in range(50):
            assert read_answer(s)[2] == b"GET /%d gzip=False" % i
        _, headers, body = read_answer(s)
        assert body == b"GET /last gzip=False" and headers["connection"] == "close"
        assert closed(s)


def test_http_1_0_closes_unless_kept_alive(plain: Running) -> None:
    with connect(plain.port) as s:
        s.sendall(b"GET /old HTTP/1.0\r\n\r\n")
        assert read_answer(s)[2] == b"GET /old gzip=False" and closed(s)
    with connect(plain.port) as s:
        s.sendall(b"GET /old HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert read_answer(s)[0] == 200
        s.sendall(b"GET /again HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert read_answer(s)[2] == b"GET /again gzip=False"


def test_only_get_and_head_are_answered(plain: Running) -> None:
    with connect(plain.port) as s:
        for method in (b"POST", b"PUT", b"DELETE", b"PATCH"):
            s.sendall(method + b" /v3/rocketmq HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
            status, headers, _ = read_answer(s)
            assert status == 405 and headers["allow"] == "GET, HEAD"
        s.sendall(b"GET /after HTTP/1.1\r\n\r\n")  # the bodies were skipped: the connection goes on
        assert read_answer(s)[2] == b"GET /after gzip=False"


def test_bad_requests_get_400_or_431_and_are_closed(plain: Running) -> None:
    with connect(plain.port) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert read_answer(s)[0] == 400 and closed(s)
    with connect(plain.port) as s:
        s.sendall(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
        assert read_answer(s)[0] == 431 and closed(s)
    with connect(plain.port) as s:  # the server is still there
        s.sendall(b"GET /ok HTTP/1.1\r\n\r\n")
        assert read_answer(s)[0] == 200


def test_a_failing_handler_is_a_500_and_serving_goes_on(plain: Running) -> None:
    with connect(plain.port) as s:
        s.sendall(b"GET /boom HTTP/1.1\r\n\r\nGET /fine HTTP/1.1\r\n\r\n")
        assert read_answer(s)[0] == 500
        assert read_answer(s)[2] == b"GET /fine gzip=False"


def test_basic_auth_checks_bcrypt_once_and_keeps_the_order() -> None:
    password_hash = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    auth = BasicAuth("prom", password_hash)
    running = start(auth=auth.as_auth())
    good = "Basic " + base64.b64encode(b"prom:s3cret").decode()
    bad = "Basic " + base64.b64encode(b"prom:guess").decode()
    try:
        with connect(running.port) as s:
            # A header not seen before waits for bcrypt (in a thread); what follows waits its turn.
            s.sendall(b"".join(
                b"GET /%d HTTP/1.1\r\nAuthorization: %s\r\n\r\n" % (i, (good if i % 3 else bad).encode())
                for i in range(9)
            ) + b"GET /none HTTP/1.1\r\n\r\n")
            for i in range(9):
                status, headers, body = read_answer(s)
                if i % 3:
                    assert (status, body) == (200, b"GET /%d gzip=False" % i)
                else:
                    assert status == 401 and headers["www-authenticate"].startswith("Basic realm=")
                    assert b'"url":"/%d"' % i in body
            assert read_answer(s)[0] == 401
        assert auth.known(good) and not auth.known(bad)
    finally:
        running.close()


def test_idle_connections_are_closed_busy_ones_are_not() -> None:
    running = start(idle_timeout_s=0.5)
    try:
        with connect(running.port) as idle, connect(running.port) as busy:
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                busy.sendall(b"GET /x HTTP/1.1\r\n\r\n")
                assert read_answer(busy)[0] == 200
                time.sleep(0.05)
            assert closed(idle)
            busy.sendall(b"GET /y HTTP/1.1\r\n\r\n")
            assert read_answer(busy)[0] == 200
    finally:
        running.close()
