"""A lean HTTP/1.1 load generator for bench/serve.py, and the trivial server it measures as a floor.

``load HOST PORT SECONDS CONCURRENCY [RATE]``: keep-alive connections on raw asyncio protocols,
one request in flight per connection (or RATE requests/s in all), latencies from write to last
byte; every connection is opened before the first request is sent, and answers over 200 ms are
listed (when sent, how long). Request lines ``KIND PATH`` come on stdin; each connection picks among them at random.
Prints one JSON line: latencies (s) per kind, non-200 answers, CPU seconds of this process, the
event loop. It runs on uvloop when installed (~21 us of CPU per request here, asyncio's loop ~68):
the client shares the two cores with the server it measures. An aiohttp client in the
benchmark's own process had cost more CPU per request than the server.

``floor PORT FILE...``: answers every GET with the bytes of the FILE whose name (``KIND.body``)
matches the path's kind (``/metrics``: metrics, else status), with no lookup and no parsing past
the request's end, on asyncio's loop as serve: what serving pre-rendered bytes costs at the
least, with this client, here.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import sys
import time
from functools import partial
from pathlib import Path

SLOW_S = 0.2  # answers slower than this are listed (when sent, how long, connection, its n-th answer)


class _Conn(asyncio.Protocol):
    """One keep-alive connection: send, wait for the whole answer, record, repeat."""

    def __init__(self, run: _Run, n: int) -> None:
        self.run = run
        self.n = n
        self.served = 0
        self.rng = random.Random(n)
        self.buf = bytearray()
        self.need = -1  # bytes of the whole answer, once its head is read
        self.started = 0.0
        self.kind = ""
        self.status_ok = True
        self.transport: asyncio.Transport | None = None
        self.closed = run.loop.create_future()
        self.period = run.concurrency / run.rate if run.rate else 0.0
        self.next_at = 0.0  # set by run() once every connection is open

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def _next(self) -> None:
        """Send now (closed loop), or at this connection's next slot (open loop), until the deadline."""
        now = time.monotonic()
        send_at = self.next_at if self.period else now
        if send_at >= self.run.deadline:
            assert self.transport is not None
            self.transport.close()
            return
        self.next_at += self.period
        if send_at > now:
            self.run.loop.call_later(send_at - now, self._send)
        else:
            self._send()

    def _send(self) -> None:
        self.kind, request = self.rng.choice(self.run.requests)
        self.started = time.perf_counter()
        assert self.transport is not None
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.need < 0:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            self.status_ok = head[9:12] == b"200"
            at = head.find(b"\r\ncontent-length:")
            if at < 0:
                raise RuntimeError("answer without Content-Length: " + head[:200].decode(errors="replace"))
            line_end = head.find(b"\r\n", at + 2)
            length = int(head[at + 17:line_end if line_end >= 0 else len(head)])
            self.need = end + 4 + length
        if len(self.buf) < self.need:
            return
        if len(self.buf) > self.need:
            raise RuntimeError("more bytes than one answer: the server pipelined or miscounted")
        took = time.perf_counter() - self.started
        self.run.latencies[self.kind].append(took)
        if took > SLOW_S:
            self.run.slow.append((round(self.started - self.run.t0, 3), round(took, 3), self.n, self.served))
        self.served += 1
        if not self.status_ok:
            self.run.errors += 1
        self.buf.clear()
        self.need = -1
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)


class _Run:
    def __init__(self, host: str, paths: list[tuple[str, str]], seconds: float, concurrency: int,
                 rate: float | None, headers: str) -> None:
        self.loop = asyncio.get_running_loop()
        self.requests = [
            (kind, f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{headers}\r\n".encode()) for kind, path in paths
        ]
        self.deadline = time.monotonic() + seconds
        self.concurrency = concurrency
        self.rate = rate
        self.latencies: dict[str, list[float]] = {kind: [] for kind, _ in paths}
        self.errors = 0
        self.t0 = time.perf_counter()
        self.slow: list[tuple[float, float, int, int]] = []


async def run(host: str, port: int, paths: list[tuple[str, str]], seconds: float, concurrency: int,
              rate: float | None = None, headers: str = "Accept-Encoding: gzip\r\n") -> dict:
    r = _Run(host, paths, seconds, concurrency, rate, headers)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    conns = []
    for n in range(concurrency):
        _, proto = await r.loop.create_connection(partial(_Conn, r, n), host, port)
        conns.append(proto)
    # Every connection is open before the first request: an answer's time is then the server's
    # work and queue, not the wait for the server to accept the last of the connections.
    r.deadline = time.monotonic() + seconds
    r.t0 = time.perf_counter()
    for c in conns:
        c.next_at = time.monotonic() + c.rng.random() * c.period
        c._next()
    lost = await asyncio.gather(*(c.closed for c in conns))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    broken = [e for e in lost if e is not None]
    return {
        "latencies": r.latencies,
        "slow": r.slow,
        "errors": r.errors + len(broken),
        "cpu_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
        "loop": type(r.loop).__module__.split(".")[0],
    }


class _Floor(asyncio.Protocol):
    def __init__(self, answers: dict[bytes, bytes]) -> None:
        self.answers = answers
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            request, self.buf = self.buf[:end], self.buf[end + 4:]
            metrics = request.startswith(b"GET /metrics ")
            self.transport.write(self.answers[b"metrics" if metrics else b"status"])


async def floor(port: int, files: list[str]) -> None:
    answers = {}
    for name in files:
        body = Path(name).read_bytes()
        kind = Path(name).name.split(".")[0].encode()
        extra = b"Content-Encoding: gzip\r\n" if kind == b"metrics" else b""
        answers[kind] = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra) + body
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Floor(answers), "127.0.0.1", port, backlog=1024)
    print(f"floor listening on 127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await server.serve_forever()


def main() -> None:
    if sys.argv[1] == "floor":
        asyncio.run(floor(int(sys.argv[2]), sys.argv[3:]))
        return
    try:
        import uvloop
    except ImportError:
        pass
    else:
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    host, port, seconds, concurrency = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    rate = float(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[6] != "-" else None
    paths = [tuple(line.split(" ", 1)) for line in sys.stdin.read().splitlines() if line.strip()]
    result = asyncio.run(run(host, port, paths, seconds, concurrency, rate))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
