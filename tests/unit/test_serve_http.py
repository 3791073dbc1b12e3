"""serve's HTTP side (pipeline/serve/asgi.py on uvicorn) over real sockets: keep-alive, HEAD,
pipelining in order, 405/400, paths left percent-encoded, header rules, basic auth through bcrypt
(once per header, one at a time), and the limits: head size, head deadline, idle timeout,
connection cap.

Every wait is for the event itself (an answer, a closed socket) within a generous bound.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import bcrypt
import pytest

from pipeline.serve.app import BasicAuth
from pipeline.serve.asgi import (
    HTTP_PROTOCOLS,
    MAX_PIPELINED,
    App,
    Limits,
    Reply,
    Request,
    accepts_gzip,
    build_server,
    origin_path,
)

BOUND_S = 20.0  # generous: only a broken server takes this long


def answer(request: Request) -> Reply:
    if request.path == "/boom":
        raise RuntimeError("a bug in a handler")
    body = f"{request.method.decode()} {request.path} gzip={request.accept_gzip}".encode()
    return Reply(200, b"text/plain", body, ((b"X-Test", b"1"),))


class Running:
    """A uvicorn server with serve's app and limits, on its own loop in a thread, on a free port."""

    def __init__(self, app: App, limits: Limits, http: str) -> None:
        self.server = build_server(app, limits, http=http)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete,
                                       args=(self.server.serve(sockets=[self.sock]),), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + BOUND_S
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(BOUND_S)
        self.sock.close()


HTTP = {"protocol": "httptools"}


@pytest.fixture(autouse=True, params=HTTP_PROTOCOLS)
def http(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every case on each of uvicorn's protocols serve offers."""
    HTTP["protocol"] = request.param
    yield request.param
    HTTP["protocol"] = "httptools"


def start(app: App | None = None, **limits: Any) -> Running:
    return Running(app or App(answer), Limits(**limits), HTTP["protocol"])


@pytest.fixture
def plain(http: str) -> Iterator[Running]:
    running = start()
    yield running
    running.close()


class Client:
    """A raw socket that reads answers one at a time (pipelined answers stay buffered)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND_S)
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
    if "content-length" not in headers and headers.get("connection") == "close":  # body until the end
        closed(c)
        body, c.buf = c.buf, b""
        return status, headers, body
    length = 0 if head_only else int(headers["content-length"])
    while len(c.buf) < length:
        c._fill()
    body, c.buf = c.buf[:length], c.buf[length:]
    return status, headers, body


def closed(c: Client) -> bool:
    """Waits (bounded) until the server closes the connection; True once it has."""
    c.sock.settimeout(BOUND_S)
    try:
        while True:
            chunk = c.sock.recv(65536)
            if not chunk:
                return True
            c.buf += chunk
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def is_closed_now(c: Client) -> bool:
    """Without waiting: has the server closed the connection?"""
    readable, _, _ = select.select([c.sock], [], [], 0)
    if not readable:
        return False
    try:
        return c.sock.recv(1, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


def get(path: str = "/x", headers: str = "Host: x\r\n") -> bytes:
    return f"GET {path} HTTP/1.1\r\n{headers}\r\n".encode()


def test_keep_alive_head_and_query_strings(plain: Running) -> None:
    with connect(plain.port) as s:
        s.sendall(b"HEAD /a?x=1 HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip, br\r\n\r\n")
        status, headers, body = read_answer(s, head_only=True)
        assert status == 200 and body == b"" and headers["content-length"] == str(len(b"HEAD /a gzip=True"))
        assert headers["x-test"] == "1" and headers["content-type"] == "text/plain" and "date" in headers
        for _ in range(3):  # the same connection goes on
            s.sendall(get("/v3/a%20b/c%2Fd?y"))
            assert read_answer(s)[::2] == (200, b"GET /v3/a%20b/c%2Fd gzip=False")  # decoded by the routes


def test_pipelined_requests_are_answered_in_order_and_close_ends_it(plain: Running) -> None:
    with connect(plain.port) as s:
        s.sendall(b"".join(get(f"/{i}") for i in range(20)) + get("/last", "Host: x\r\nConnection: close\r\n"))
        for i in range(20):
            assert read_answer(s)[::2] == (200, f"GET /{i} gzip=False".encode())
        assert read_answer(s)[2] == b"GET /last gzip=False"
        assert closed(s)


def test_a_client_pipelining_past_the_bound_is_dropped_after_its_first_answers(plain: Running, http: str) -> None:
    """httptools parses a whole read at once: past MAX_PIPELINED queued requests the connection goes.
    h11 parses one request at a time (the rest stays raw bytes, reading paused): all are answered."""
    with connect(plain.port) as s:
        s.sendall(b"".join(get(f"/{i}") for i in range(200)))
        answers = 0
        with contextlib.suppress(ConnectionError):
            while answers < 200:
                assert read_answer(s)[::2] == (200, f"GET /{answers} gzip=False".encode())
                answers += 1
        assert answers == (200 if http == "h11" else MAX_PIPELINED + 1)
    with connect(plain.port) as other:  # and the server goes on
        other.sendall(get("/other"))
        assert read_answer(other)[0] == 200


def test_only_get_and_head_are_answered_without_waiting_for_the_body(plain: Running) -> None:
    with connect(plain.port) as s:
        s.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")  # no body follows
        status, headers, _ = read_answer(s)
        assert status == 405 and headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize("request_bytes", [
    b"GARBAGE\r\n\r\n",
    b"GET /x HTTP/1.1\r\n\r\n",  # no Host
    b"GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    b"GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: Basic eDp5\r\nAuthorization: Basic eDp6\r\n\r\n",
])
def test_bad_requests_get_400(plain: Running, request_bytes: bytes) -> None:
    with connect(plain.port) as s:
        s.sendall(request_bytes)
        status, _, body = read_answer(s)
        assert status == 400 and b"/" not in body.replace(b"HTTP/1.1", b"")  # short, no paths


def test_an_oversized_head_is_refused_while_it_arrives() -> None:
    running = start(App(answer, max_header_bytes=16384), max_header_bytes=16384)
    try:
        with connect(running.port) as s:
            s.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000)  # never terminated
            assert read_answer(s)[0] in (400, 431)
            assert closed(s)
        with connect(running.port) as s:  # a whole head over the limit, in one read
            s.sendall(get("/x", "Host: x\r\nX-Big: " + "a" * 17000 + "\r\n"))
            assert read_answer(s)[0] in (400, 431)
        with connect(running.port) as s:  # a head just under the limit is fine
            s.sendall(get("/x", "Host: x\r\nX-Big: " + "a" * 15000 + "\r\n"))
            assert read_answer(s)[0] == 200
    finally:
        running.close()


def test_a_failing_handler_is_a_500_and_serving_goes_on(plain: Running) -> None:
    with connect(plain.port) as s:
        s.sendall(get("/boom"))
        status, _, body = read_answer(s)
        assert status == 500 and b"RuntimeError" not in body and b"Traceback" not in body
        s.sendall(get("/ok"))
        assert read_answer(s)[0] == 200


def test_headers_the_app_reads() -> None:
    assert accepts_gzip(b"gzip") and accepts_gzip(b"br, GZIP;q=0.5") and accepts_gzip(b"*")
    assert not accepts_gzip(b"gzip;q=0") and not accepts_gzip(b"br") and not accepts_gzip(b"")
    assert origin_path(b"http://example.com/metrics") == b"/metrics"
    assert origin_path(b"HTTPS://example.com") == b"/" and origin_path(b"/v3/x") == b"/v3/x"


def test_absolute_form_targets_reach_the_path(plain: Running) -> None:
    with connect(plain.port) as s:
        s.sendall(get("http://x/metrics"))
        assert read_answer(s)[::2] == (200, b"GET /metrics gzip=False")


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class CountingAuth(BasicAuth):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.verified: list[str] = []
        self.running = 0
        self.most_at_once = 0
        self._count = threading.Lock()

    def verify(self, header: str) -> bool:
        with self._count:
            self.verified.append(header)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            return super().verify(header)
        finally:
            with self._count:
                self.running -= 1


def test_basic_auth_runs_bcrypt_once_per_header_one_at_a_time_and_keeps_the_order() -> None:
    auth = CountingAuth("prometheus", bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=8)).decode())
    running = start(App(answer, auth.check, BasicAuth.denied))
    good, bad = basic("prometheus", "s3cret"), basic("prometheus", "wrong")
    try:
        with connect(running.port) as a, connect(running.port) as b, connect(running.port) as c:
            for client in (a, b, c):  # three connections at once, each pipelining
                client.sendall(b"".join(get(f"/{i}", f"Host: x\r\nAuthorization: {h}\r\n")
                                        for i, h in enumerate([good, bad, good, bad, good])) + get("/none"))
            for client in (a, b, c):
                assert [read_answer(client)[0] for _ in range(6)] == [200, 401, 200, 401, 200, 401]
        assert sorted(auth.verified) == sorted([good, bad])  # each header's verdict is remembered
        assert auth.most_at_once == 1
        assert auth.known(good) and not auth.known(bad)
    finally:
        running.close()


def test_idle_connections_are_closed_busy_ones_are_not() -> None:
    running = start(idle_timeout_s=2.0)
    try:
        with connect(running.port) as idle, connect(running.port) as busy:
            idle.sendall(get("/first"))
            assert read_answer(idle)[0] == 200
            deadline = time.monotonic() + BOUND_S
            while not is_closed_now(idle):  # the event itself: the idle one is closed
                assert time.monotonic() < deadline, "the idle connection was never closed"
                busy.sendall(get("/x"))  # a request every ~50 ms, far inside the 2 s timeout
                assert read_answer(busy)[0] == 200
                time.sleep(0.05)
            busy.sendall(get("/y"))
            assert read_answer(busy)[0] == 200
    finally:
        running.close()


def test_a_slow_head_is_cut_off_and_others_are_answered_meanwhile() -> None:
    running = start(header_timeout_s=1.0, idle_timeout_s=60.0)
    try:
        with connect(running.port) as slow, connect(running.port) as silent:
            deadline = time.monotonic() + BOUND_S
            head = b"GET /x HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
            sent = 0
            while not is_closed_now(slow):
                assert time.monotonic() < deadline, "a head trickling in was never cut off"
                with contextlib.suppress(OSError):
                    slow.sendall(head[sent:sent + 1])
                sent = (sent + 1) % len(head)
                with connect(running.port) as other:
                    other.sendall(get("/other"))
                    assert read_answer(other)[0] == 200
                time.sleep(0.05)
            assert closed(silent)  # a connection that never sends a head goes too
    finally:
        running.close()


def test_connections_beyond_the_cap_are_closed_at_once() -> None:
    running = start(max_connections=3)
    try:
        with contextlib.ExitStack() as stack:
            held = [stack.enter_context(connect(running.port)) for _ in range(3)]
            for c in held:
                c.sendall(get("/held"))
                assert read_answer(c)[0] == 200
            with connect(running.port) as extra:
                assert closed(extra) and extra.buf == b""
            held[0].sock.close()
            deadline = time.monotonic() + BOUND_S
            while True:  # once one goes, a new one is served
                with connect(running.port) as again, contextlib.suppress(ConnectionError, OSError):
                    again.sendall(get("/again"))
                    if read_answer(again)[0] == 200:
                        break
                assert time.monotonic() < deadline, "no connection was served after one closed"
    finally:
        running.close()


def test_expect_continue_gets_the_final_answer_at_once(plain: Running) -> None:
    with connect(plain.port) as s:
        s.sendall(get("/x", "Host: x\r\nExpect: 100-continue\r\n"))
        assert read_answer(s)[::2] == (200, b"GET /x gzip=False")
        s.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        assert read_answer(s)[0] == 405  # no body was sent: the 405 does not wait for it
