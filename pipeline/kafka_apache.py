"""A single-node Apache Kafka (KRaft) started from its Maven jars, for tests, benchmarks and demos.

Production runs Apache Kafka, so the tests do too: the broker here is the real one (``kafka.Kafka``
from ``org.apache.kafka:kafka_2.13``), run as one process that is both controller and broker, on
loopback ports, with its log in a folder of its own and a small heap. :func:`start_apache_kafka`
formats the storage, starts the broker, waits until it answers a metadata request and creates the
topics asked for; :meth:`ApacheKafka.stop` and :meth:`ApacheKafka.start` stop it and start it again
on the same ports and data (a broker restart). The process dies with its parent.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.children import DIE_WITH_PARENT, stop_child
from pipeline.jvm import java_binary, maven_classpath
from pipeline.kafka_local import create_topics, free_port
from schemas.errors import FaultwatchError

KAFKA_VERSION = "4.1.1"
# The broker logs through SLF4J; without a binding it would print nothing at all.
_ARTIFACTS = (f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}", "org.slf4j:slf4j-simple:1.7.36")
HEAP = "512m"
# How long a start (or a restart, which loads the logs again first) may take before it is an error:
# over 60 s was seen at a load average of 25-40 on two cores; waiting longer costs nothing when it is up.
START_TIMEOUT_S = 180.0


class ApacheKafkaError(FaultwatchError, RuntimeError):
    pass


def kafka_classpath() -> list[Path]:
    """Apache Kafka's jars, resolved through Maven once and cached (``scripts/bootstrap.sh test``)."""
    return maven_classpath(f"kafka-{KAFKA_VERSION}", list(_ARTIFACTS))


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (as StorageTool makes),
    never starting with "-" (as Kafka's own ids: the format step would take it for an option)."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found


def _properties(port: int, controller_port: int, data: Path, extra: Mapping[str, object],
                listeners: Mapping[str, int]) -> dict[str, str]:
    more = "".join(f",{name}://127.0.0.1:{p}" for name, p in listeners.items())
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}{more}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}{more}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
        + "".join(f",{name}:{name}" for name in listeners),
        "log.dirs": str(data),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "log.flush.interval.messages": str(2**62),  # the OS flushes: a test broker need not fsync
    }
    props.update({k: str(v) for k, v in extra.items()})
    return props


@dataclass
class ApacheKafka:
    """A running single-node Apache Kafka on 127.0.0.1. Use as a context manager, or call :meth:`stop`."""

    port: int
    controller_port: int
    home: Path
    classpath: list[Path]
    client_options: dict[str, Any] = field(default_factory=dict)
    heap: str = HEAP
    proc: subprocess.Popen[bytes] | None = None
    topics: list[str] = field(default_factory=list)
    owns_home: bool = True
    listeners: dict[str, int] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        """The PLAINTEXT listener (topics, test data); :meth:`listener` gives the others."""
        return f"127.0.0.1:{self.port}"

    def listener(self, name: str) -> str:
        """The bootstrap address of the extra listener ``name`` (e.g. SASL_SSL)."""
        return f"127.0.0.1:{self.listeners[name]}"

    @property
    def log_path(self) -> Path:
        return self.home / "broker.log"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the broker on its ports and data (again, after :meth:`stop`) and wait until it answers."""
        if self.proc is not None and self.proc.poll() is None:
            return
        cmd = [java_binary(), f"-Xmx{self.heap}", "-Xms64m", "-XX:+UseSerialGC", "-Xss1m",
               "-Djava.awt.headless=true", "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
               "-Dorg.slf4j.simpleLogger.showDateTime=true",
               "-cp", os.pathsep.join(map(str, self.classpath)), "kafka.Kafka", str(self.home / "server.properties")]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=DIE_WITH_PARENT,  # noqa: PLW1509
            )
        wait_answering(self.bootstrap, self.proc, self.log_path, timeout_s, self.client_options)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the broker (SIGTERM: a clean shutdown; SIGKILL if it takes longer than ``timeout_s``)."""
        stop_child(self.proc, timeout_s)

    def close(self) -> None:
        """Stop the broker and delete its data folder (if this object made it)."""
        self.stop()
        if self.owns_home:
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> ApacheKafka:  # noqa: PYI034 - a dataclass, not meant to be subclassed
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_answering(bootstrap: str, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float,
                   client_options: Mapping[str, Any] | None = None) -> None:
    """Return once the broker at ``bootstrap`` answers a metadata request with itself in it."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise ApacheKafkaError(f"Apache Kafka exited with code {proc.returncode} while starting; "
                                   f"last lines of {log_path}:\n{_tail(log_path)}")
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap.split(","), request_timeout_ms=3000,
                                     **dict(client_options or {}))
            try:
                if admin.describe_cluster().get("brokers"):
                    return
            finally:
                admin.close()
        except KafkaError:
            pass
        if time.monotonic() > deadline:
            raise ApacheKafkaError(f"Apache Kafka at {bootstrap} did not answer within {timeout_s:.0f}s; "
                                   f"last lines of {log_path}:\n{_tail(log_path)}")
        time.sleep(0.2)


def _tail(path: Path, lines: int = 20) -> str:
    """The log's last ``lines`` lines, Java stack frames left out (the exception's own line stays)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join([line for line in text if not line.lstrip().startswith("at ")][-lines:])


def _format_storage(classpath: list[Path], config: Path, log_path: Path, extra: Sequence[str]) -> None:
    cmd = [java_binary(), "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", os.pathsep.join(map(str, classpath)),
           "kafka.tools.StorageTool", "format", "--config", str(config), f"--cluster-id={_cluster_id()}",
           "--standalone", "--ignore-formatted", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    with open(log_path, "a") as log:
        log.write(done.stdout + done.stderr)
    if done.returncode != 0:
        raise ApacheKafkaError(f"formatting Kafka's storage failed ({config}):\n{_tail(log_path)}")


def start_apache_kafka(
    topics: Sequence[str] = (),
    partitions: int = 4,
    extra_properties: Mapping[str, object] | None = None,
    port: int | None = None,
    home: str | os.PathLike[str] | None = None,
    client_options: Mapping[str, Any] | None = None,
    heap: str = HEAP,
    timeout_s: float = START_TIMEOUT_S,
    listeners: Sequence[str] = (),
    format_args: Sequence[str] = (),
) -> ApacheKafka:
    """Start a single-node Apache Kafka on loopback and create ``topics`` with ``partitions`` each.

    ``extra_properties`` are added to (or replace) the broker's ``server.properties`` (e.g.
    ``log.retention.check.interval.ms``, or listeners of other security protocols; ``port`` then
    names the listener the clients use, and ``client_options`` are the kafka-python settings they
    need). ``listeners`` names further listeners, each on a free port and with the security protocol
    of its name (``SASL_SSL``, ``SSL``, ``SASL_PLAINTEXT``; their settings go in ``extra_properties``,
    the address is ``.listener(name)``); the clients' PLAINTEXT listener stays. ``format_args`` go
    to the storage format step (e.g. ``--add-scram`` for SCRAM users). ``home`` holds the
    configuration, data and log (a fresh temporary folder if None, deleted by
    :meth:`ApacheKafka.close`).
    """
    classpath = kafka_classpath()
    port = port or free_port()
    controller_port = free_port()
    owns = home is None
    root = Path(home or tempfile.mkdtemp(prefix="faultwatch-kafka-"))
    root.mkdir(parents=True, exist_ok=True)
    more = {name: free_port() for name in listeners}
    props = _properties(port, controller_port, root / "data", extra_properties or {}, more)
    config = root / "server.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    kafka = ApacheKafka(port=port, controller_port=controller_port, home=root, classpath=classpath,
                        client_options=dict(client_options or {}), heap=heap, owns_home=owns, listeners=more)
    try:
        _format_storage(classpath, config, kafka.log_path, format_args)
        kafka.start(timeout_s)
        if topics:
            create_topics(kafka.bootstrap, topics, partitions, client_options=kafka.client_options)
            kafka.topics = list(topics)
    except BaseException:
        kafka.close()
        raise
    return kafka


@contextlib.contextmanager
def apache_kafka(topics: Sequence[str] = (), partitions: int = 4, **kwargs: Any) -> Iterator[ApacheKafka]:
    kafka = start_apache_kafka(topics=topics, partitions=partitions, **kwargs)
    try:
        yield kafka
    finally:
        kafka.close()


if __name__ == "__main__":  # `python -m pipeline.kafka_apache`: resolve the jars now (set-up, CI)
    print(f"Apache Kafka {KAFKA_VERSION}: {len(kafka_classpath())} jars resolved and cached")
