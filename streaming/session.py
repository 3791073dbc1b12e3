"""The one way faultwatch makes a SparkSession."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

from pipeline.config import Config
from schemas.errors import FaultwatchError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession


DEFAULT_DRIVER_MEMORY = "1g"
# The JVMs' flags by ``[spark] jvm``. dev: the quick JIT only (C1) and the serial collector, see
# spark_session. production: the optimising JIT (C2) and G1, named so that a container of one or two
# CPUs does not fall back to the serial collector. Measured side by side in docs/performance.md.
JAVA_OPTIONS = {"dev": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC", "production": "-XX:+UseG1GC"}
DEFAULT_JAVA_OPTIONS = JAVA_OPTIONS["dev"]
# Spark writes a few small checkpoint files per micro-batch (offsets, commits, a state delta per
# shuffle partition). Its default manager for local paths goes through Hadoop's FileContext,
# whose local file system forks ``chmod`` and ``readlink`` processes for every file without
# Hadoop's native library (pip's pyspark has none). The FileSystem-based manager writes the same
# way (a temporary file, then a rename: atomic on a local disk) without those forks: a live
# micro-batch's WAL and commit steps took ~13 ms instead of ~50-60 ms each (docs/performance.md).
LOCAL_CHECKPOINT_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


class JavaMissingError(FaultwatchError, RuntimeError):
    pass


# Spark starts every Python process (the executors' worker daemon, the data source's planners, the
# streaming source's runner) with $SPARK_HOME/python/lib/pyspark.zip and py4j's zip at the head of
# PYTHONPATH. Python caches no bytecode for modules imported from a zip, so each of those processes
# compiled pyspark's sources again (~1.2 CPU-s each, several per query start and one on the first
# micro-batch's path), and every task's importlib.invalidate_caches() re-read the zip's directory.
# With pip's pyspark, SPARK_HOME is that very package, installed beside the zips: a wrapper around
# this interpreter drops the two zips from PYTHONPATH, and the same modules load compiled from
# site-packages. Measured on the whole default job (docs/performance.md): first micro-batch ~2 s
# sooner, ~4 CPU-s and ~0.3 GiB less per start.
_WRAPPER = """#!/bin/sh
# Written by faultwatch (streaming/session.py): {python} without pyspark's bundled zips on PYTHONPATH.
set -f
old=$PYTHONPATH
new=
IFS=:
for p in $old; do
  case "$p" in
    {zips}) ;;
    *) new="${{new:+$new:}}$p" ;;
  esac
done
unset IFS
PYTHONPATH=$new
# Spark runs these as "python -m ...", which puts the working directory first on sys.path: a
# project's own pipeline/ or streaming/ there would shadow faultwatch's (Python 3.11+ honours this).
PYTHONSAFEPATH=1
export PYTHONPATH PYTHONSAFEPATH
# Spark's planner daemons run pyspark's own daemon: run faultwatch's, which ends quietly on a closed socket.
if [ "$1" = -m ] && [ "$2" = pyspark.daemon ]; then
  shift 2
  set -- -m streaming.daemon "$@"
fi
exec {python} "$@"
"""


def worker_python(master: str) -> str:
    """The interpreter Spark should start its executors' Python processes with: :func:`driver_python`
    for a local master, this interpreter itself for executors elsewhere (the wrapper is on this
    machine only)."""
    return driver_python() if master.startswith("local") else sys.executable


def driver_python() -> str:
    """The interpreter for the Python processes Spark starts on this machine: this one, through the
    wrapper above when that is safe (pip's pyspark used as SPARK_HOME, a working /bin/sh)."""
    import hashlib
    import shlex
    import tempfile

    import pyspark

    package = os.path.dirname(os.path.abspath(pyspark.__file__))
    home = os.environ.get("SPARK_HOME")
    lib = os.path.join(package, "python", "lib")  # where Spark's PYTHONPATH points
    if (home and os.path.realpath(home) != os.path.realpath(package)) or (
        not os.path.isfile(os.path.join(lib, "pyspark.zip")) or not os.path.exists("/bin/sh")
    ):
        return sys.executable  # another Spark: its zips are the code to run
    patterns = "|".join(f"{shlex.quote(os.path.join(d, 'pyspark.zip'))}|{shlex.quote(os.path.join(d, 'py4j-'))}*-src.zip"
                        for d in dict.fromkeys([lib, os.path.realpath(lib)]))  # as given, and as the JVM may see it
    text = _WRAPPER.format(python=shlex.quote(sys.executable), zips=patterns)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"faultwatch-python-{os.getuid()}-{digest}")
    try:
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.chmod(tmp, 0o755)
            os.replace(tmp, path)
        probe = subprocess.run([path, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                               timeout=60, check=False)
        if probe.returncode == 0 and probe.stdout.strip() == sys.executable:
            return path
    except OSError:
        pass
    return sys.executable  # e.g. a read-only or noexec temporary directory: the zips, slower


@functools.cache
def java_version(java: str) -> str:
    """What ``java -version`` prints (asked once per process: a JVM start costs ~0.2 s)."""
    return subprocess.run([java, "-version"], check=False, capture_output=True, text=True, timeout=30).stderr


def check_java() -> str:
    """Return the java executable, or raise a clear error instead of py4j's stack trace."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise JavaMissingError(
            "Spark needs Java 17 (or 21), and no 'java' was found"
            + (f" under JAVA_HOME={java_home}" if java_home else " on PATH")
            + ". Install it (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or set JAVA_HOME."
        )
    try:
        out = java_version(java)
    except OSError as exc:
        raise JavaMissingError(f"cannot run {java}: {exc}") from None
    if '"1.8' in out or 'version "11' in out:
        raise JavaMissingError(f"Spark 4 needs Java 17 or later; {java} is: {out.splitlines()[0]}")
    return java


def is_local_path(path: str) -> bool:
    """Whether ``path`` is on the local file system (no scheme, or ``file:``)."""
    from urllib.parse import urlparse

    return urlparse(path).scheme in ("", "file")


def spark_session(cfg: Config, ui: bool = False) -> SparkSession:
    """Create (or return the active) session from ``cfg.spark``; workers use this interpreter."""
    java = check_java()
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the driver's JVM already
    from streaming import class_archive

    options = JAVA_OPTIONS[cfg.spark.jvm]
    driver_options = options
    if not submitted and "spark.driver.extraJavaOptions" not in cfg.spark.conf:
        driver_options = class_archive.driver_options(java, options)  # classes mapped, not loaded
    executor_options = class_archive.executor_options(java, options)
    if "PYSPARK_PYTHON" not in os.environ:
        os.environ["PYSPARK_PYTHON"] = worker_python(cfg.spark.master)
    # The JVM starts its data source lookup with this one (on this machine, whatever the master).
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", driver_python())
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(cfg.spark.master)
        .appName(cfg.spark.app_name)
        .config("spark.sql.shuffle.partitions", str(cfg.spark.shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        # workers fork from a daemon that has imported what the tasks use (streaming/daemon.py)
        .config("spark.python.daemon.module", "streaming.daemon")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.metricsEnabled", "false")
        .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
        # and not from the directory the job was started in (see the wrapper above)
        .config("spark.executorEnv.PYTHONSAFEPATH", "1")
        # The JVM only moves Arrow chunks between Python processes; its default heap (a quarter of
        # the machine's memory) just lets garbage pile up. [spark.conf] may raise it.
        .config("spark.driver.memory", DEFAULT_DRIVER_MEMORY)
        # For the same reason the JVM's optimising JIT (C2) and its concurrent collector (G1) are not
        # worth their CPU: their threads compete with the Python workers for the cores, and a small
        # heap of short-lived garbage is collected as cheaply by the serial collector
        # (docs/performance.md).
        .config("spark.driver.extraJavaOptions", driver_options)
        .config("spark.executor.extraJavaOptions", executor_options)
        # A stateful task prefers the executor that holds its state store, and by default a free
        # executor waits 3 s before it takes another one's task: on a cluster a whole micro-batch
        # could stall for it. The fault and lag states are a few MiB, cheaper to load from the
        # checkpoint than to wait for; an executor still takes its own tasks first.
        .config("spark.locality.wait", "0s")
        # The JVM reaches its Python workers over Unix domain sockets instead of loopback TCP (Spark
        # 4.1+): a live micro-batch starts a dozen Python runners, each with its own connection.
        .config("spark.python.unix.domain.socket.enabled", "true")
    )
    if is_local_path(cfg.storage.checkpoint_root):
        builder = builder.config("spark.sql.streaming.checkpointFileManagerClass", LOCAL_CHECKPOINT_MANAGER)
    from streaming.s3a import spark_conf as s3a_conf

    for key, value in merged_conf(delta_conf(cfg), s3a_conf(cfg.storage.root, cfg.storage.checkpoint_root)).items():
        builder = builder.config(key, value)
    for key, value in cfg.spark.conf.items():  # [spark.conf] may set any of the above
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if submitted:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        flags = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
        notice = driver_flags_notice([str(f) for f in flags], options)
        if notice:
            print(notice, file=sys.stderr, flush=True)
    return spark


def merged_conf(*parts: dict[str, str]) -> dict[str, str]:
    """Several groups of session settings as one; their ``spark.jars`` lists are joined, not replaced
    (delta-spark's jars and, for s3:// roots, S3A's)."""
    out: dict[str, str] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = f"{out[key]},{value}" if key == "spark.jars" and out.get(key) else value
    return out


def delta_conf(cfg: Config) -> dict[str, str]:
    """delta-spark's settings for the session (streaming/deltaspark.py): required by the delta-spark
    writer, and otherwise added when its jars resolve, for Spark users' Delta commands."""
    from streaming import deltaspark

    if cfg.storage.writer == "delta-spark":
        return deltaspark.session_conf(deltaspark.delta_jars())
    return deltaspark.optional_session_conf()


def driver_flags_notice(jvm_flags: list[str], options: str = DEFAULT_JAVA_OPTIONS) -> str | None:
    """What to tell a user whose spark-submit started the driver's JVM without the flags of its
    ``[spark] jvm`` (the session's settings come too late for a running JVM); None when they are
    all there."""
    missing = [f for f in options.split() if f not in jvm_flags]
    if not missing:
        return None
    return (
        f"faultwatch: note: the driver's JVM runs without {' '.join(missing)}: spark-submit started it "
        "before faultwatch could set its flags ([spark] jvm). Pass --driver-java-options "
        f"\"{options}\" --driver-memory {DEFAULT_DRIVER_MEMORY} to spark-submit (README: Running on a cluster)."
    )
