"""``faultwatch serve`` as a process, against clients that try to exhaust or mislead it.

Each case runs against the real server process (started from the command line over a copy of the
outage tables) and asserts two things while the abuse goes on: the server's resident memory grows
by less than a stated figure, and another, well-behaved client is answered. Waits are for the
event itself (an answer, the server dropping the connections) within generous bounds; nothing is
timed tightly. The limits are set low in the config so the cases run in seconds.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import orjson
import psutil
import pytest

from pipeline.publish.sinks import write_cluster_files
from tests.integration.processes import kill_tree
from tests.integration.test_serve_security import self_signed, start_serve, write_serve_config
from tests.unit.test_serve import CLUSTER, _write, avoidance_doc, get, get_json, write_outage_tables

MIB = 1 << 20
BOUND_S = 60.0  # generous bound for events; only a broken server takes this long
# The outage tables are simulated once per test run: their newest event must not turn /healthz
# stale while the cases run, since these cases check other reasons.
LIMITS = "header_timeout_s = 2.0\nsend_timeout_s = 2.0\nidle_timeout_s = 5.0\nmax_data_age_s = 86400.0\n"


@dataclass
class Served:
    url: str
    port: int
    proc: psutil.Process
    log: Path
    tmp: Path
    context: ssl.SSLContext | None = None

    def rss(self) -> int:
        return int(self.proc.memory_info().rss)

    def connections(self) -> int:
        """Established connections the server process holds on its port."""
        return sum(1 for c in self.proc.net_connections("tcp")
                   if c.laddr and c.laddr.port == self.port and c.status == psutil.CONN_ESTABLISHED)


@contextlib.contextmanager
def started(tmp_path: Path, extra: str = "", env: dict[str, str] | None = None) -> Iterator[Served]:
    write_outage_tables(tmp_path)
    conf = write_serve_config(tmp_path, LIMITS + extra)
    log = tmp_path / "serve.log"
    popen, url = start_serve(conf, log, env or {})
    try:
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        served = Served(url, port, psutil.Process(popen.pid), log, tmp_path)
        yield served
    finally:
        kill_tree(popen, 15)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with started(tmp_path) as s:
        yield s


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = BOUND_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not seen within {timeout_s} s"
        time.sleep(0.1)
    return value


def warmed(s: Served) -> int:
    """RSS once the server has answered its first refresh's documents a few times."""
    wait_for(lambda: get(s.url + "metrics", context=s.context)[0] == 200, "the first refresh")
    for _ in range(5):
        get(s.url + "metrics", context=s.context)
        get(s.url + f"v3/rocketmq/{CLUSTER}/consumer/CG_pay/status", context=s.context)
    return s.rss()


def answered(s: Served, **kw: Any) -> None:
    """Another client gets a whole, correct answer (it waits for the answer itself)."""
    status, body, _ = get(s.url + "metrics", context=s.context, **kw)
    assert status == 200 and b"faultwatch_table_up" in body


def raw(s: Served) -> socket.socket:
    return socket.create_connection(("127.0.0.1", s.port), timeout=BOUND_S)


def head(path: str = "/metrics", extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


def test_unterminated_and_oversized_heads_are_cut_off(served: Served) -> None:
    base = warmed(served)
    with raw(served) as sock:
        sent = 0
        with contextlib.suppress(ConnectionError):  # the server closes while we still send
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Junk: ")
            while sent < 64 * MIB:
                sock.sendall(b"a" * 65536)
                sent += 65536
        assert sent < 8 * MIB, f"the server read {sent} bytes of one header line"
        answered(served)
    with raw(served) as sock:
        sock.sendall(head(extra="X-Big: " + "b" * 65536 + "\r\n"))
        assert sock.recv(65536).split(b"\r\n")[0] in (b"HTTP/1.1 400 Bad Request",
                                                        b"HTTP/1.1 431 Request Header Fields Too Large")
    answered(served)
    assert served.rss() - base < 20 * MIB


def test_a_pipelining_client_that_never_reads_is_dropped(served: Served) -> None:
    base = warmed(served)
    burst = head() * (100_000 // len(head()))  # ~100 KB of GET /metrics, never read
    socks = [raw(served) for _ in range(3)]
    try:
        for sock in socks:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            with contextlib.suppress(ConnectionError, TimeoutError):
                sock.settimeout(5)
                sock.sendall(burst)
        answered(served)
        peak = served.rss()
        # The send timeout (2 s) drops them: the server holds none of their connections.
        wait_for(lambda: served.connections() == 0, "the non-reading clients dropped")
        answered(served)
        assert peak - base < 40 * MIB, f"{(peak - base) / MIB:.0f} MiB for 3 clients that never read"
    finally:
        for sock in socks:
            sock.close()


def test_slowloris_and_idle_connections_are_closed(served: Served) -> None:
    base = warmed(served)
    slow = [raw(served) for _ in range(50)]
    idle = [raw(served) for _ in range(300)]
    try:
        answered(served)
        assert wait_for(lambda: served.connections() >= 300, "the connections accepted")
        trickle = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 10_000
        deadline = time.monotonic() + BOUND_S
        i = 0
        while served.connections() > 0:  # one byte per connection every ~0.1 s: far below the head limit
            assert time.monotonic() < deadline, f"{served.connections()} connections still held"
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.send(trickle[i:i + 1])
            i += 1
            time.sleep(0.1)
        answered(served)
        assert served.rss() - base < 40 * MIB
    finally:
        for sock in slow + idle:
            sock.close()


def test_names_that_look_like_paths_reach_only_their_own_resource(served: Served) -> None:
    base = warmed(served)
    now_ms = int(time.time() * 1000)
    write_cluster_files(str(served.tmp / "avoidance"), [
        (n, orjson.dumps(avoidance_doc(n, now_ms))) for n in (f"{CLUSTER}/consumer", "..", "x%2fy")])
    api = served.url + "v3/rocketmq"
    wait_for(lambda: len(get_json(api)[1].get("clusters", [])) == 4, "the new clusters")
    assert get_json(f"{api}/{CLUSTER}/consumer")[1]["consumers"] == ["CG_pay"]
    assert get_json(f"{api}/{CLUSTER}%2Fconsumer/avoidance")[1]["cluster"] == f"{CLUSTER}/consumer"
    assert get_json(f"{api}/%2E%2E/avoidance")[1]["cluster"] == ".."
    assert get_json(f"{api}/x%252fy/avoidance")[1]["cluster"] == "x%2fy"
    assert get_json(f"{api}/x%2fy/avoidance")[0] == 404
    answered(served)
    assert served.rss() - base < 20 * MIB


def test_a_deleted_table_and_a_bad_avoidance_file_are_named(served: Served) -> None:
    base = warmed(served)
    table = served.tmp / "tables" / "broker_health"
    table.rename(served.tmp / "away")
    (served.tmp / "avoidance" / "Bad.json").write_bytes(b'{"cluster": "Bad", "decided_ms": []}')

    def unhealthy() -> list[str] | None:
        status, doc = get_json(served.url + "healthz")
        return doc["reasons"] if status == 503 and len(doc["reasons"]) == 2 else None

    reasons = wait_for(unhealthy, "healthz 503 naming both")
    assert reasons == ["table broker_health does not exist", "avoidance file Bad.json: decided_ms is not an integer"]
    metrics = get(served.url + "metrics")[1]
    assert b'faultwatch_table_up{table="broker_health"} 0.0' in metrics
    assert b'faultwatch_avoidance_file_unusable{file="Bad.json"} 1.0' in metrics
    assert get(served.url + f"v3/rocketmq/{CLUSTER}/avoidance")[0] == 200  # the good list still served
    answered(served)
    assert served.rss() - base < 20 * MIB
    (served.tmp / "away").rename(table)
    (served.tmp / "avoidance" / "Bad.json").unlink()
    wait_for(lambda: get_json(served.url + "healthz")[0] == 200, "healthz 200 again")


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_a_flood_of_wrong_passwords_costs_bcrypt_once_per_header(tmp_path: Path) -> None:
    password_hash = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=10)).decode()
    env = {"FAULTWATCH_SERVE_BASIC_AUTH_PASSWORD_HASH": password_hash}
    with started(tmp_path, 'basic_auth_username = "prometheus"\n', env) as s:
        good = basic("prometheus", "right")
        wait_for(lambda: get(s.url + "metrics", auth=good)[0] == 200, "the first refresh")
        base, cpu = s.rss(), sum(s.proc.cpu_times()[:2])
        wrong = basic("prometheus", "wrong")
        flood = [raw(s) for _ in range(10)]
        try:
            for sock in flood:  # 10 connections x 20 pipelined requests, the same wrong password
                sock.sendall(head(extra=f"Authorization: {wrong}\r\n") * 20)
            answered(s, auth=good)
            for sock in flood:
                got = b""
                while got.count(b"HTTP/1.1 401 ") < 20:
                    chunk = sock.recv(65536)
                    assert chunk, got[-300:]
                    got += chunk
        finally:
            for sock in flood:
                sock.close()
        spent = sum(s.proc.cpu_times()[:2]) - cpu
        one = time.process_time()
        bcrypt.checkpw(b"wrong", password_hash.encode())
        one = time.process_time() - one
        # 200 checks of one header: bcrypt ran for it once (200 runs would cost 200 x ``one``).
        assert spent < 20 * one + 2.0, f"{spent:.1f} s of CPU; one bcrypt costs {one:.3f} s"
        assert s.rss() - base < 20 * MIB
        text = s.log.read_text()
        assert text.count("failed login") == 1 and "user 'prometheus'" in text


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_tls_connections_without_a_handshake(tmp_path: Path, loop: str) -> None:
    cert, key = self_signed(tmp_path)
    env = {"FAULTWATCH_SERVE_TLS_CERT_FILE": str(cert), "FAULTWATCH_SERVE_TLS_KEY_FILE": str(key)}
    with started(tmp_path, f'loop = "{loop}"\n', env=env) as s:
        s.context = ssl.create_default_context(cafile=str(cert))
        base = warmed(s)
        silent = [raw(s) for _ in range(200)]
        try:
            answered(s)
            grown = s.rss() - base
            # Under 100 KiB each (asyncio's default read buffer alone is 256 KiB per connection).
            assert grown < 200 * 100 * 1024, f"{grown / MIB:.0f} MiB for 200 silent TLS connections"
        finally:
            for sock in silent:
                sock.close()
        answered(s)


def test_an_unreadable_table_under_rust_backtrace_gets_short_503s_without_paths(tmp_path: Path) -> None:
    with started(tmp_path, env={"RUST_BACKTRACE": "full"}) as s:
        base = warmed(s)
        table = s.tmp / "tables" / "queue_lag"
        _write(s.tmp / "tables", "queue_lag", [{"cluster": CLUSTER, "consumer_group": "CG_pay", "topic": "TopicPay",
                                                "broker_name": "broker-a", "queue_id": 0, "ts_ms": 1, "event_date": "x"}])
        newest = max(table.rglob("*.parquet"), key=lambda p: p.stat().st_mtime)
        newest.write_bytes(b"not parquet at all")
        doc = wait_for(lambda: (r := get_json(s.url + "healthz"))[0] == 503 and r, "healthz 503")[1]
        assert len(doc["reasons"]) == 1 and doc["reasons"][0].startswith("table queue_lag unreadable: "), doc
        answers = [get(s.url + "healthz"), get(f"{s.url}v3/rocketmq/{CLUSTER}/consumer/CG_pay/status"),
                   get(s.url + "nowhere")]
        assert [a[0] for a in answers] == [503, 503, 404]
        for _, body, _ in answers:
            text = body.decode()
            assert len(body) < 1024 and str(s.tmp) not in text and "backtrace" not in text.lower(), text
        answered(s)
        assert s.rss() - base < 20 * MIB


def test_gzip_only_when_accepted_and_every_request_logged_at_v(served: Served) -> None:
    import urllib.request

    warmed(served)

    def metrics(accept: str) -> tuple[str | None, bytes]:
        request = urllib.request.Request(served.url + "metrics", headers={"Accept-Encoding": accept})
        with urllib.request.urlopen(request, timeout=BOUND_S) as resp:
            return resp.headers.get("Content-Encoding"), resp.read()

    assert metrics("gzip")[0] == "gzip"
    encoding, body = metrics("gzip;q=0, identity")
    assert encoding is None and b"faultwatch_table_up" in body
    with raw(served) as sock:  # and a bad request is logged too, with its status
        sock.sendall(b"GET /x HTTP/1.1\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 400 ")
    def logged() -> bool:  # each line is written once its answer went out: wait for the last one itself
        text = served.log.read_text()
        return '"GET /x HTTP/1.1" 400' in text and text.count('"GET /metrics HTTP/1.1" 200') >= 8

    wait_for(logged, "the access log lines")
