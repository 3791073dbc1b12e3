"""faultwatch's Java clients (``clients/java``) as processes: the lab driver and the admin poller.

The jars are built by ``scripts/bootstrap.sh test`` (Maven, into each module's ``target/``); RocketMQ's
client comes at the version asked for (4.9.x or 5.x), resolved once by :func:`pipeline.jvm.maven_classpath`,
so the same faultwatch jars run on both client lines. :class:`LabDriver` speaks the driver's line
protocol: one command on stdin, one JSON object back on stdout.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.children import DIE_WITH_PARENT
from pipeline.jvm import JvmError, java_binary, maven_classpath
from pipeline.rocketmq_cluster import JDK17_FLAGS

CLIENTS = Path(__file__).resolve().parent.parent / "clients" / "java"
CLIENTS_VERSION = "0.1.0"
KAFKA_CLIENTS = "org.apache.kafka:kafka-clients:4.1.1"
JACKSON = "com.fasterxml.jackson.core:jackson-databind:2.17.2"


def built_jar(module: str) -> Path:
    """``clients/java/<module>/target/faultwatch-<module>-<version>.jar``, or a message on how to build it."""
    jar = CLIENTS / module / "target" / f"faultwatch-{module}-{CLIENTS_VERSION}.jar"
    if not jar.exists():
        raise JvmError(f"{jar} is missing: build the Java clients with `scripts/bootstrap.sh test` "
                       f"(or mvn -q -B -f {CLIENTS / 'pom.xml'} install -DskipTests)")
    return jar


def client_classpath(client_version: str) -> str:
    """The lab driver, the hook and the feed client over RocketMQ's client ``client_version``."""
    deps = maven_classpath(
        f"rocketmq-client-{client_version}",
        [f"org.apache.rocketmq:rocketmq-client:{client_version}", KAFKA_CLIENTS, JACKSON],
    )
    ours = [built_jar(m) for m in ("lab", "send-hook", "feed-client")]
    return os.pathsep.join(map(str, [*ours, *deps]))


def poller_classpath() -> str:
    """The poller's jar: its manifest names its dependencies, copied beside it into ``target/lib``."""
    return str(built_jar("admin-poller"))


def _java(classpath: str, main: str, args: Sequence[str], heap_mb: int, home: Path,
          jvm_args: Sequence[str] = ()) -> list[str]:
    home.mkdir(parents=True, exist_ok=True)
    return [java_binary(), f"-Xmx{heap_mb}m", "-XX:+UseSerialGC", f"-Duser.home={home}",
            "-Drocketmq.client.logUseSlf4j=false", *JDK17_FLAGS, *jvm_args, "-cp", classpath, main, *args]


class LabDriver:
    """A real producer (``io.faultwatch.rocketmq.lab.Driver``) at ``client_version``, driven line by line."""

    def __init__(self, client_version: str, home: Path, jvm_args: Sequence[str] = (), **options: str) -> None:
        self._launch(client_version, home, jvm_args, options)
        self.ready()

    @classmethod
    def launched(cls, client_version: str, home: Path, jvm_args: Sequence[str] = (), **options: str) -> LabDriver:
        """A driver whose JVM is started and not waited for: call :meth:`ready` before any command
        (several drivers then start side by side)."""
        driver = cls.__new__(cls)
        driver._launch(client_version, home, jvm_args, options)
        return driver

    def _launch(self, client_version: str, home: Path, jvm_args: Sequence[str], options: dict[str, str]) -> None:
        args = [a for k, v in options.items() for a in (f"--{k.replace('_', '-')}", str(v))]
        argv = _java(client_classpath(client_version), "io.faultwatch.rocketmq.lab.Driver", args, 256, home, jvm_args)
        self.client_version = client_version
        self.log_path = home / "driver.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1,
            preexec_fn=DIE_WITH_PARENT,  # noqa: PLW1509
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._quitting = False
        threading.Thread(target=self._read, daemon=True).start()

    def ready(self, timeout_s: float = 120.0) -> None:
        """Wait for the driver's first line, its producer started (once, for a :meth:`launched` driver)."""
        line = self._next(timeout_s)
        if line.get("cmd") != "ready":
            raise JvmError(f"the lab driver did not start: {line}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self._lines.put(line)
        self._lines.put(None)

    def _next(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise JvmError(f"the lab driver gave no answer within {timeout_s:.0f}s; log {self.log_path}") from None
        if line is None:
            raise JvmError(f"the lab driver exited ({self.proc.poll()}); log:\n{self.tail()}")
        out: dict[str, Any] = json.loads(line)
        return out

    def command(self, line: str, timeout_s: float = 120.0) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = self._next(timeout_s)
        if "error" in out:
            raise JvmError(f"lab driver command {line.split(' ', 1)[0]!r} failed: {out['error']}")
        return out

    def tail(self, lines: int = 30) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def quit(self) -> None:
        """Ask the driver to shut its producer down and exit, without waiting (:meth:`close` waits)."""
        if self.proc.poll() is None and not self._quitting:
            self._quitting = True
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except OSError:
                pass  # it exited meanwhile: close() reaps it

    def close(self) -> None:
        self.quit()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def run_poller(namesrv: str, cluster: str, groups: Sequence[str], home: Path, *extra: str,
               timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """One cycle of the admin poller (``--once``); its events on stdout, its status line on stderr."""
    args = ["--namesrv", namesrv, "--cluster", cluster, "--once",
            *[a for g in groups for a in ("--group", g)], *extra]
    argv = _java(poller_classpath(), "io.faultwatch.rocketmq.poller.AdminPoller", args, 192, home)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)


def start_poller(namesrv: str, cluster: str, groups: Sequence[str], home: Path, *extra: str) -> subprocess.Popen[bytes]:
    """The admin poller running on its interval; events to ``home/events.jsonl``, status to ``home/status.jsonl``."""
    args = ["--namesrv", namesrv, "--cluster", cluster, *[a for g in groups for a in ("--group", g)], *extra]
    argv = _java(poller_classpath(), "io.faultwatch.rocketmq.poller.AdminPoller", args, 192, home)
    with open(home / "events.jsonl", "ab") as out, open(home / "status.jsonl", "ab") as err:
        return subprocess.Popen(
            argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            preexec_fn=DIE_WITH_PARENT,  # noqa: PLW1509
        )
