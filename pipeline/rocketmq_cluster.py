"""A real RocketMQ cluster on loopback: one name server and a few brokers, from Maven Central's jars.

The tests and the lab need real brokers to kill and freeze. Each process is ``java -cp`` over the
jars :func:`pipeline.jvm.maven_classpath` resolved (the stock scripts ask for gigabytes of heap),
with a small heap, small mapped files and its own store folder; every process dies with its parent.
Broker ``i`` listens on ``base + 10 * i`` (a broker also takes the port two below and one above).
Readiness is the process's own "boot success" line, never a fixed wait.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.children import DIE_WITH_PARENT, stop_child, stop_children
from pipeline.jvm import JvmError, java_binary, maven_classpath
from pipeline.kafka_local import free_port

SERVER_VERSION = "5.3.3"
CLUSTER_NAME = "DefaultCluster"
# What JDK 17 must open for RocketMQ's direct buffers and its 4.9.x client.
JDK17_FLAGS = (
    "--add-opens", "java.base/java.nio=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-exports", "java.base/jdk.internal.ref=ALL-UNNAMED",
)
_BROKER_SETTINGS = {
    "brokerId": "0",
    "brokerIP1": "127.0.0.1",
    "flushDiskType": "ASYNC_FLUSH",
    "brokerRole": "ASYNC_MASTER",
    "mappedFileSizeCommitLog": str(64 * 1024 * 1024),
    "mappedFileSizeConsumeQueue": str(30_000 * 20),
    "maxIndexNum": "20000",
    "maxHashSlotNum": "5000",
    "diskMaxUsedSpaceRatio": "98",
    "autoCreateTopicEnable": "true",
    "autoCreateSubscriptionGroup": "true",
    "timerWheelEnable": "false",
    "enablePropertyFilter": "true",
}


class ClusterError(JvmError):
    pass


def server_classpath(version: str = SERVER_VERSION) -> str:
    jars = maven_classpath(
        f"rocketmq-server-{version}",
        [f"org.apache.rocketmq:rocketmq-namesrv:{version}", f"org.apache.rocketmq:rocketmq-broker:{version}"],
    )
    return os.pathsep.join(map(str, jars))


def tools_classpath(version: str = SERVER_VERSION) -> str:
    jars = maven_classpath(f"rocketmq-tools-{version}", [f"org.apache.rocketmq:rocketmq-tools:{version}"])
    return os.pathsep.join(map(str, jars))


@dataclass
class JavaProcess:
    """One started JVM: its log and how to stop it."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                start_new_session=True,
                preexec_fn=DIE_WITH_PARENT,  # noqa: PLW1509
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_child(self.proc, timeout_s)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def wait_for_line(self, needle: str, timeout_s: float, since: int = 0) -> None:
        """Wait until the log holds ``needle`` after byte ``since``; fail at once if the JVM exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError), open(self.log_path, "rb") as fh:
                fh.seek(since)
                if needle.encode() in fh.read():
                    return
            if not self.running:
                raise ClusterError(f"{self.name} exited before '{needle}'; its log:\n{self.tail()}")
            time.sleep(0.1)
        raise ClusterError(f"{self.name} did not print '{needle}' within {timeout_s:.0f}s; its log:\n{self.tail()}")

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


@dataclass
class RocketMQCluster:
    """A name server and brokers ``broker-a``, ``broker-b``, ... under ``home`` (see :func:`start_cluster`)."""

    home: Path
    namesrv_port: int
    classpath: str
    heap_mb: int
    namesrv: JavaProcess | None = None
    brokers: dict[str, JavaProcess] = field(default_factory=dict)
    broker_ports: dict[str, int] = field(default_factory=dict)
    version: str = SERVER_VERSION
    owns_home: bool = False  # a temporary folder start_cluster made: removed by stop()

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    def _env(self) -> dict[str, str]:
        return {**os.environ, "ROCKETMQ_HOME": str(self.home)}

    def _java(self, main: str, args: Sequence[str], heap_mb: int, user_home: Path) -> list[str]:
        user_home.mkdir(parents=True, exist_ok=True)  # RocketMQ logs under ~/logs: one folder per process
        return [
            java_binary(), f"-Xms{heap_mb}m", f"-Xmx{heap_mb}m", f"-XX:MaxDirectMemorySize={heap_mb}m",
            "-XX:+UseSerialGC", "-Xss512k", f"-Duser.home={user_home}",
            *JDK17_FLAGS, "-cp", self.classpath, main, *args,
        ]

    def start_namesrv(self, timeout_s: float = 120.0) -> None:
        conf = self.home / "namesrv.properties"
        conf.write_text(f"listenPort={self.namesrv_port}\n")
        self.namesrv = JavaProcess(
            "namesrv",
            self._java("org.apache.rocketmq.namesrv.NamesrvStartup", ["-c", str(conf)], min(self.heap_mb, 256),
                       self.home / "namesrv-home"),
            self.home / "namesrv.log",
            self._env(),
        )
        since = self.namesrv.log_size()
        self.namesrv.start()
        self.namesrv.wait_for_line("boot success", timeout_s, since)

    def add_broker(self, name: str, port: int) -> JavaProcess:
        store = self.home / name
        store.mkdir(parents=True, exist_ok=True)
        settings = {
            **_BROKER_SETTINGS,
            "brokerClusterName": CLUSTER_NAME,
            "brokerName": name,
            "listenPort": str(port),
            "namesrvAddr": self.namesrv_addr,
            "storePathRootDir": str(store),
            "storePathCommitLog": str(store / "commitlog"),
        }
        conf = self.home / f"{name}.properties"
        conf.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        proc = JavaProcess(
            name,
            self._java("org.apache.rocketmq.broker.BrokerStartup", ["-c", str(conf)], self.heap_mb, store / "home"),
            self.home / f"{name}.log",
            self._env(),
        )
        self.brokers[name] = proc
        self.broker_ports[name] = port
        return proc

    def start_brokers(self, names: Sequence[str], timeout_s: float = 180.0) -> None:
        """Start ``names`` together (they only need the name server) and wait for each one's boot line."""
        marks = {n: self.brokers[n].log_size() for n in names}
        for n in names:
            self.brokers[n].start()
        for n in names:
            self.brokers[n].wait_for_line("boot success", timeout_s, marks[n])
        self.wait_registered(names, timeout_s)

    def wait_registered(self, names: Sequence[str], timeout_s: float) -> None:
        """Wait until the name server's cluster list holds every broker of ``names``."""
        deadline = time.monotonic() + timeout_s
        listed = ""
        while time.monotonic() < deadline:
            listed = self.mqadmin("clusterList")
            if all(f" {n} " in listed for n in names):
                return
            time.sleep(0.5)
        raise ClusterError(f"brokers {list(names)} not all in the name server's cluster list:\n{listed}")

    def add_running_broker(self, name: str, timeout_s: float = 180.0) -> None:
        """Start one more broker ``name`` (on its own free ports) in the running cluster and wait for it."""
        if name in self.brokers:
            raise ClusterError(f"broker {name} is already in the cluster")
        self.add_broker(name, _broker_base_port(1))
        self.start_brokers([name], timeout_s)

    def kill(self, name: str) -> None:
        """SIGKILL: clients get refused connections; the name server drops the broker's route."""
        self.brokers[name].kill()

    def freeze(self, name: str) -> None:
        """SIGSTOP: the port stays open and nothing answers (clients time out)."""
        self.brokers[name].signal(signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        self.brokers[name].signal(signal.SIGCONT)

    def restart(self, name: str, timeout_s: float = 180.0) -> None:
        self.brokers[name].kill()
        self.start_brokers([name], timeout_s)

    def mqadmin(self, *args: str, timeout_s: float = 120.0) -> str:
        """Run RocketMQ's own ``mqadmin`` (rocketmq-tools' MQAdminStartup) against this cluster."""
        argv = [
            java_binary(), "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", f"-Duser.home={self.home}",
            *JDK17_FLAGS, "-cp", tools_classpath(self.version),
            "org.apache.rocketmq.tools.command.MQAdminStartup", args[0], "-n", self.namesrv_addr, *args[1:],
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=self._env(), check=False)
        if done.returncode != 0:
            raise ClusterError(f"mqadmin {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done.stdout

    def create_topic(self, topic: str, queues: int = 4) -> None:
        """The topic on every broker of the cluster, ``queues`` read and write queues each."""
        out = self.mqadmin("updateTopic", "-c", CLUSTER_NAME, "-t", topic, "-r", str(queues), "-w", str(queues))
        created = out.count("create topic to")
        if created < len(self.running_brokers()):
            raise ClusterError(f"topic {topic} reached {created} of {len(self.running_brokers())} brokers:\n{out}")

    def running_brokers(self) -> list[str]:
        return [n for n, p in self.brokers.items() if p.running]

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the brokers together (SIGTERM, SIGKILL after ``timeout_s``), then the name server."""
        stop_children([b.proc for b in self.brokers.values()], timeout_s)
        if self.namesrv is not None:
            self.namesrv.stop(timeout_s)
        if self.owns_home:
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> RocketMQCluster:  # noqa: PYI034 - a dataclass, not meant to be subclassed
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _broker_base_port(count: int) -> int:
    """A port ``p`` such that p-2 .. p+10*count-9 look free (each broker takes L-2, L and L+1)."""
    for _ in range(50):
        base = free_port()
        if base < 3 or base + 10 * count > 65_000:
            continue
        ports = [base + 10 * i + d for i in range(count) for d in (-2, 0, 1)]
        if all(_port_free(p) for p in ports):
            return base
    raise ClusterError("found no free run of ports for the brokers")


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_cluster(
    brokers: int = 3, home: str | os.PathLike[str] | None = None, heap_mb: int = 320, version: str = SERVER_VERSION
) -> RocketMQCluster:
    """Start a name server and ``brokers`` brokers (``broker-a``, ...) and wait until each booted."""
    if not 1 <= brokers <= 26:
        raise ClusterError(f"brokers must be 1..26, got {brokers}")
    folder = Path(home or tempfile.mkdtemp(prefix="faultwatch-rocketmq-"))
    folder.mkdir(parents=True, exist_ok=True)
    cluster = RocketMQCluster(folder, free_port(), server_classpath(version), heap_mb, version=version,
                              owns_home=home is None)
    try:
        cluster.start_namesrv()
        base = _broker_base_port(brokers)
        names = [f"broker-{chr(ord('a') + i)}" for i in range(brokers)]
        for i, name in enumerate(names):
            cluster.add_broker(name, base + 10 * i)
        cluster.start_brokers(names)
    except BaseException:
        cluster.stop()
        raise
    return cluster
