"""What the session sets from the config, and the flags its driver JVM starts with."""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest

from streaming.session import is_local_path, worker_python


@pytest.mark.parametrize(("path", "local"), [
    ("data/checkpoints", True), ("/var/lib/faultwatch/checkpoints", True), ("file:///tmp/cp", True),
    ("hdfs://nn:8020/faultwatch/cp", False), ("s3a://bucket/cp", False), ("abfss://c@a.dfs.core.windows.net/cp", False),
])
def test_only_local_checkpoint_roots_get_the_fork_free_checkpoint_manager(path: str, local: bool) -> None:
    assert is_local_path(path) is local


def test_sparks_python_processes_import_pyspark_compiled_not_from_its_zip(spark) -> None:  # type: ignore[no-untyped-def]
    """The session's workers start through worker_python's wrapper: pyspark comes from site-packages
    and neither bundled zip is on sys.path (each import from them compiled pyspark again)."""
    import os

    def where(batches):  # type: ignore[no-untyped-def]
        import sys

        import pyarrow as pa
        import pyspark

        for _ in batches:
            zips = [p for p in sys.path if p.endswith(("pyspark.zip", "-src.zip"))]
            yield pa.RecordBatch.from_pydict({"file": [pyspark.__file__], "zips": [",".join(zips)]})

    rows = spark.range(2, numPartitions=2).mapInArrow(where, "file string, zips string").collect()
    assert os.environ["PYSPARK_PYTHON"].startswith(os.path.join(tempfile.gettempdir(), "faultwatch-python-"))
    assert len(rows) == 2
    for row in rows:
        assert ".zip" not in row.file and row.file.endswith(os.path.join("pyspark", "__init__.py"))
        assert row.zips == ""


def test_the_wrapper_drops_only_pysparks_zips_from_pythonpath() -> None:
    import os

    import pyspark

    wrapper = worker_python("local[2]")
    assert wrapper != sys.executable
    lib = os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "python", "lib")
    keep = ["/opt/a b/x", "/data/*", "/elsewhere/pyspark.zip.d"]
    path = [os.path.join(lib, "pyspark.zip"), keep[0], os.path.join(lib, "py4j-0.10.9.9-src.zip"), *keep[1:]]
    out = subprocess.run([wrapper, "-c", "import os, sys; print(os.environ['PYTHONPATH']); print(sys.executable)"],
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(path)}, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == [os.pathsep.join(keep), sys.executable]


@pytest.mark.parametrize("master, spark_home", [("spark://host:7077", None), ("local[2]", "/opt/spark-4.3.0")])
def test_executors_elsewhere_or_another_spark_keep_this_interpreter(monkeypatch, master, spark_home) -> None:  # type: ignore[no-untyped-def]
    """The wrapper exists on this machine only, and another Spark's zips may hold another pyspark."""
    if spark_home is None:
        monkeypatch.delenv("SPARK_HOME", raising=False)
    else:
        monkeypatch.setenv("SPARK_HOME", spark_home)
    assert worker_python(master) == sys.executable


# A fresh driver JVM from spark_session, asked what it runs with: its input arguments, the collectors
# it made and the highest JIT tier (4: C2, 1: C1 only).
_ASK_THE_JVM = """
import json, sys
from pipeline.config import load_config
from streaming.session import spark_session
spark = spark_session(load_config(sys.argv[1], env={}))
mx = spark.sparkContext._jvm.java.lang.management.ManagementFactory
hotspot = mx.getPlatformMXBean(spark.sparkContext._jvm.com.sun.management.HotSpotDiagnosticMXBean._java_lang_class)
print(json.dumps({
    "conf": spark.conf.get("spark.driver.extraJavaOptions"),
    "args": [str(a) for a in mx.getRuntimeMXBean().getInputArguments()],
    "collectors": sorted({str(b.getName()).split()[0] for b in mx.getGarbageCollectorMXBeans()}),
    "tier": str(hotspot.getVMOption("TieredStopAtLevel").getValue()),
}))
spark.stop()
"""


@pytest.mark.parametrize(("jvm", "flags", "collectors", "tier"), [
    ("production", ["-XX:+UseG1GC"], ["G1"], "4"),
    ("dev", ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"], ["Copy", "MarkSweepCompact"], "1"),
])
def test_the_configured_jvm_flags_reach_the_drivers_jvm(tmp_path, jvm, flags, collectors, tier) -> None:  # type: ignore[no-untyped-def]
    """``[spark] jvm`` picks the flags the driver's JVM starts with (read back from that JVM)."""
    import json
    import os
    from pathlib import Path

    from streaming.session import JAVA_OPTIONS

    conf = tmp_path / "faultwatch.toml"
    conf.write_text(f'[spark]\njvm = "{jvm}"\n')
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "FAULTWATCH_CLASS_ARCHIVE": "0", "PYTHONPATH": str(repo)}  # no background archive build
    out = subprocess.run([sys.executable, "-c", _ASK_THE_JVM, str(conf)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["conf"] == JAVA_OPTIONS[jvm] == " ".join(flags)
    assert [a for a in seen["args"] if a.startswith(("-XX:TieredStopAtLevel", "-XX:+Use"))] == flags
    assert (seen["collectors"], seen["tier"]) == (collectors, tier)


def test_a_submitted_driver_without_faultwatchs_jvm_flags_is_told_what_to_pass() -> None:
    from streaming.session import DEFAULT_JAVA_OPTIONS, driver_flags_notice

    assert driver_flags_notice(["-Xmx1g", *DEFAULT_JAVA_OPTIONS.split()]) is None
    notice = driver_flags_notice(["-Xmx6g", "-XX:+UseSerialGC"])
    assert notice is not None
    assert "runs without -XX:TieredStopAtLevel=1:" in notice
    assert f'--driver-java-options "{DEFAULT_JAVA_OPTIONS}" --driver-memory 1g' in notice
    notice = driver_flags_notice(["-Xmx1g", *DEFAULT_JAVA_OPTIONS.split()], "-XX:+UseG1GC")
    assert notice is not None and notice.startswith("faultwatch: note: the driver's JVM runs without -XX:+UseG1GC:")


def test_delta_and_s3a_settings_join_their_jars() -> None:
    """delta-spark's jars and S3A's both reach the session: one list, not the later one alone."""
    from streaming.session import merged_conf

    delta = {"spark.jars": "/m2/delta-spark.jar,/m2/delta-storage.jar", "spark.sql.extensions": "x"}
    s3a = {"spark.jars": "/m2/hadoop-aws.jar", "spark.hadoop.fs.s3a.endpoint": "http://h:1"}
    assert merged_conf(delta, s3a) == {
        "spark.jars": "/m2/delta-spark.jar,/m2/delta-storage.jar,/m2/hadoop-aws.jar",
        "spark.sql.extensions": "x", "spark.hadoop.fs.s3a.endpoint": "http://h:1"}
    assert merged_conf({}, s3a) == s3a and merged_conf(delta, {}) == delta
