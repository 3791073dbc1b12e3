"""Spark's class-data-sharing archive: built by a real JDK, used by the session's driver and
executors, and never put in place when a JVM cannot start with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from streaming import class_archive
from streaming.session import DEFAULT_JAVA_OPTIONS, check_java

pytestmark = pytest.mark.spark

SESSION_FLAGS = (
    "import sys\n"
    "from pipeline.config import Config\n"
    "from streaming.session import spark_session\n"
    "spark = spark_session(Config())\n"
    "jvm = spark.sparkContext._jvm\n"
    "args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())\n"
    "print('FLAGS', ' '.join(str(a) for a in args))\n"
    "print('EXECUTOR', spark.conf.get('spark.executor.extraJavaOptions'))\n"
    "spark.stop()\n"
)


@pytest.mark.timeout(900)  # builds a JVM class archive, then starts a session and a JVM on it (own bounds 420 s)
def test_a_built_archive_is_what_the_session_starts_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(class_archive.ENV, "1")
    java = check_java()
    path = class_archive.archive_path(java, DEFAULT_JAVA_OPTIONS)
    assert path.parent == tmp_path / "faultwatch" and not path.exists()
    assert class_archive.build(path, DEFAULT_JAVA_OPTIONS)
    assert path.stat().st_size > 10 << 20  # Spark's classes, not an empty file
    assert not list(path.parent.glob("*.tmp")) and not path.with_suffix(".lock").exists()
    assert class_archive.driver_options(java, DEFAULT_JAVA_OPTIONS) == (
        f"{DEFAULT_JAVA_OPTIONS} -XX:SharedArchiveFile={path} {class_archive.QUIET}")
    done = subprocess.run([sys.executable, "-c", SESSION_FLAGS], check=True, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    flags = next(line for line in done.stdout.splitlines() if line.startswith("FLAGS "))
    assert f"-XX:SharedArchiveFile={path}" in flags.split()
    assert "][cds" not in done.stdout + done.stderr  # the JVM's sharing notes stay off the console
    executor = next(line for line in done.stdout.splitlines() if line.startswith("EXECUTOR "))
    assert executor.split(" ", 1)[1] == class_archive.executor_options(java, DEFAULT_JAVA_OPTIONS)
    assert f"-XX:SharedArchiveFile={path}" in executor.split()
    # An executor started by a standalone worker has this class path: its JVM maps Spark's classes
    # from the archive (-Xshare:on refuses to start on a class-path mismatch).
    home = Path(pyspark.__file__).parent
    slf4j = next((home / "jars").glob("slf4j-api-*.jar"))
    loaded = subprocess.run(
        [java, *DEFAULT_JAVA_OPTIONS.split(), f"-XX:SharedArchiveFile={path}", "-Xshare:on", "-Xlog:class+load=info",
         "-cp", f"{home / 'conf'}:{slf4j}:{home / 'jars'}/*", "org.apache.spark.util.Utils"],
        check=False, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert "org.apache.spark.util.Utils source: shared objects file" in loaded.stdout, loaded.stdout[-2000:]


@pytest.mark.timeout(600)  # two Spark JVM runs, each bounded at 120 s
def test_a_truncated_archive_fails_the_check_and_is_never_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A JVM given a cut-off archive does not start at all, so ``build`` tries each archive with
    ``-Xshare:on`` before it moves it into place; here that check refuses a truncated one."""
    bad = tmp_path / "cut.jsa"
    bad.write_bytes(b"\x00" * 4096)
    monkeypatch.chdir(tmp_path)
    assert not class_archive._run_spark(f"{DEFAULT_JAVA_OPTIONS} -XX:SharedArchiveFile={bad} -Xshare:on", 120)
    assert class_archive._run_spark(DEFAULT_JAVA_OPTIONS, 120)  # the same run without it is fine
    assert not list(tmp_path.glob("hs_err_pid*"))  # the dead JVM's crash report is not left behind


def test_without_an_archive_the_session_starts_as_before_and_a_build_starts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(class_archive.ENV, "1")
    started: list[Path] = []
    monkeypatch.setattr(class_archive, "start_build", lambda path, options: started.append(path))
    java = check_java()
    assert class_archive.driver_options(java, DEFAULT_JAVA_OPTIONS) == DEFAULT_JAVA_OPTIONS
    assert started == [class_archive.archive_path(java, DEFAULT_JAVA_OPTIONS)]
    assert class_archive.executor_options(java, DEFAULT_JAVA_OPTIONS) == DEFAULT_JAVA_OPTIONS  # never builds
    monkeypatch.setenv(class_archive.ENV, "0")
    assert class_archive.driver_options(java, DEFAULT_JAVA_OPTIONS) == DEFAULT_JAVA_OPTIONS
    assert len(started) == 1
    path = class_archive.archive_path(java, DEFAULT_JAVA_OPTIONS)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"built")
    assert class_archive.executor_options(java, DEFAULT_JAVA_OPTIONS) == DEFAULT_JAVA_OPTIONS  # turned off
    monkeypatch.setenv(class_archive.ENV, "1")
    assert class_archive.executor_options(java, DEFAULT_JAVA_OPTIONS) == (
        f"{DEFAULT_JAVA_OPTIONS} -XX:SharedArchiveFile={path} {class_archive.QUIET}")


def test_a_build_under_way_is_not_started_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "faultwatch" / "spark-x.jsa"
    path.parent.mkdir()
    path.with_suffix(".lock").write_text("1")  # a fresh lock: another process builds it
    spawned: list[object] = []
    monkeypatch.setattr(class_archive.subprocess, "Popen", lambda *a, **k: spawned.append(a))
    class_archive.start_build(path, DEFAULT_JAVA_OPTIONS)
    assert spawned == []
