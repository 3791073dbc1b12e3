"""The one way faultwatch makes a SparkSession."""

from __future__ import annotations

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
DEFAULT_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"  # C1 only: see spark_session
# Spark writes a few small checkpoint files per micro-batch (offsets, commits, a state delta per
# shuffle partition). Its default manager for local paths goes through Hadoop's FileContext,
# whose local file system forks ``chmod`` and ``readlink`` processes for every file without
# Hadoop's native library (pip's pyspark has none). The FileSystem-based manager writes the same
# way (a temporary file, then a rename: atomic on a local disk) without those forks: a live
# micro-batch's WAL and commit steps took ~13 ms instead of ~50-60 ms each (docs/performance.md).
LOCAL_CHECKPOINT_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


class JavaMissingError(FaultwatchError, RuntimeError):
    pass


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
        out = subprocess.run([java, "-version"], check=False, capture_output=True, text=True, timeout=30).stderr
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
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
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
        # The JVM only moves Arrow chunks between Python processes; its default heap (a quarter of
        # the machine's memory) just lets garbage pile up. [spark.conf] may raise it.
        .config("spark.driver.memory", DEFAULT_DRIVER_MEMORY)
        # For the same reason the JVM's optimising JIT (C2) is not worth its CPU: on 2 cores its
        # compiler threads compete with the Python workers. Without it, bench/ingest.py's first
        # micro-batch took ~2 s less (11 s, not 13-15 s) and the later ones 5-10% less.
        .config("spark.driver.extraJavaOptions", DEFAULT_JAVA_OPTIONS)
        .config("spark.executor.extraJavaOptions", DEFAULT_JAVA_OPTIONS)
    )
    if is_local_path(cfg.storage.checkpoint_root):
        builder = builder.config("spark.sql.streaming.checkpointFileManagerClass", LOCAL_CHECKPOINT_MANAGER)
    for key, value in cfg.spark.conf.items():  # [spark.conf] may set any of the above
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
