"""A class-data-sharing archive for Spark's JVMs: about 4 s off every Spark start.

Most of a ``faultwatch stream`` start is the JVM loading Spark's classes (docs/performance.md).
JDK 17 can dump the classes a run loaded (``-XX:ArchiveClassesAtExit``) and map them into later
JVMs (``-XX:SharedArchiveFile``). The archive is written as the JVM exits, after the Python
process that started it, and a truncated one makes the JVM fail to start, so it is built by a
process of its own (``python -m streaming.class_archive``): a small Spark run, its JVM waited for,
the file tried by a JVM started with ``-Xshare:on``, and only then moved into place. Keyed by the
Spark version, the JDK and the JVM flags; ``FAULTWATCH_CLASS_ARCHIVE=0`` turns it off. Executors
get it too when it is built (:func:`executor_options`): on this machine they load fewer classes
in their first tasks; elsewhere the file is missing or made for another install, and the JVM
starts as it would without it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = "FAULTWATCH_CLASS_ARCHIVE"
# Sharing flags; -Xlog keeps the JVM's notes on classes it could not archive off the console.
QUIET = "-Xlog:cds=off,cds+dynamic=off"
STALE_S = 600.0  # a build's lock or leftover older than this is from a build that died
BUILD_TIMEOUT_S = 300.0


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "faultwatch"


def archive_path(java: str, java_options: str) -> Path:
    """Where the archive for this Spark, this JDK and these JVM flags lives (it may not exist)."""
    import pyspark

    from streaming.session import java_version

    try:
        version = java_version(java)  # check_java asked already
    except OSError:
        version = java
    key = hashlib.sha256(f"{pyspark.__version__}\n{pyspark.__file__}\n{java}\n{version}\n{java_options}".encode())
    return cache_dir() / f"spark-{pyspark.__version__}-{key.hexdigest()[:12]}.jsa"


def driver_options(java: str, java_options: str) -> str:
    """:func:`executor_options`, and when no archive is built yet, a build started in the
    background (once)."""
    options = executor_options(java, java_options)
    if options == java_options and enabled():
        start_build(archive_path(java, java_options), java_options)
    return options


def executor_options(java: str, java_options: str) -> str:
    """``java_options`` plus the archive's flags when it is built here; never starts a build.

    An executor JVM maps it only if the file is there and matches its JDK and class path (same
    Spark install); otherwise sharing is off and it starts as it would without the flags.
    """
    if not enabled():
        return java_options
    path = archive_path(java, java_options)
    return f"{java_options} -XX:SharedArchiveFile={path} {QUIET}" if path.is_file() else java_options


def start_build(path: Path, java_options: str) -> None:
    """Build the archive for ``java_options`` in a detached low-priority process, unless a build is
    under way."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = path.with_suffix(".lock")
        if lock.exists() and time.time() - lock.stat().st_mtime < STALE_S:
            return
        lock.write_text(str(os.getpid()))
        subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-m", "streaming.class_archive", str(path), java_options],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=_child_env(),
        )
    except OSError:
        return  # no cache to write to: Spark starts without an archive


def build(path: Path, java_options: str, timeout_s: float = BUILD_TIMEOUT_S) -> bool:
    """Make the archive at ``path``; True when it is in place and a JVM started with it."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not _run_spark(f"{java_options} -XX:ArchiveClassesAtExit={tmp} {QUIET}", timeout_s) or not tmp.is_file():
            return False
        if not _run_spark(f"{java_options} -XX:SharedArchiveFile={tmp} -Xshare:on {QUIET}", timeout_s):
            return False
        os.replace(tmp, path)
        return True
    finally:
        tmp.unlink(missing_ok=True)
        path.with_suffix(".lock").unlink(missing_ok=True)


def _run_spark(java_options: str, timeout_s: float) -> bool:
    """A small local Spark run in a child process with ``java_options``; True if it and its JVM ended well."""
    code = (
        "import sys\n"
        "from pyspark.sql import SparkSession\n"
        "spark = (SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false')\n"
        "         .config('spark.driver.extraJavaOptions', sys.argv[1]).getOrCreate())\n"
        "spark.range(100).selectExpr('id % 7 AS k').groupBy('k').count().collect()\n"
        "proc = spark.sparkContext._gateway.proc\n"
        "spark.stop()\n"
        "proc.stdin.close()\n"  # the JVM exits on it, writing the archive first
        "sys.exit(proc.wait())\n"
    )
    env = _child_env()
    try:
        with tempfile.TemporaryDirectory() as scratch:  # a JVM that cannot map a bad archive dies
            done = subprocess.run(  # with a crash report in its working directory: drop it here
                [sys.executable, "-c", code, java_options], check=False, timeout=timeout_s, cwd=scratch, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _child_env() -> dict[str, str]:
    """This process's environment, with its import path (faultwatch from a checkout too)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def main(argv: list[str]) -> int:
    from streaming.session import DEFAULT_JAVA_OPTIONS, check_java

    if not enabled():
        return 0
    options = argv[1] if len(argv) > 1 else DEFAULT_JAVA_OPTIONS
    path = Path(argv[0]) if argv else archive_path(check_java(), options)
    if path.is_file():
        return 0
    print(f"building the class archive for Spark's JVM: {path} (once, ~45 s)", file=sys.stderr, flush=True)
    for stale in path.parent.glob(f"{path.name}.*.tmp"):  # left by a build that was killed
        if time.time() - stale.stat().st_mtime > STALE_S:
            stale.unlink(missing_ok=True)
    ok = build(path, options)
    print(f"class archive {'built' if ok else 'not built'}: {path}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
