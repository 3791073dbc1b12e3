"""delta-spark, Delta Lake's own Spark connector, in faultwatch's Spark session.

The job's session loads delta-spark's jars and its SQL extension and catalog, so Spark users'
commands (``DESCRIBE HISTORY``, time travel, ``OPTIMIZE``, ``VACUUM``) and the ``delta-spark``
writer (:mod:`streaming.delta_spark_sink`) run in it. The jars are resolved through Maven once
(:func:`pipeline.jvm.maven_classpath`, cached under ``~/.cache/faultwatch/jvm`` and ``~/.m2``), so a
later start needs no network. Only delta-spark's and delta-storage's jars are put on Spark's class
path: Spark itself provides the rest of what Maven lists (Scala, Hadoop, Jackson...).
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.jvm import JvmError, maven_classpath

log = logging.getLogger(__name__)

SPARK_VERSION = "4.2.0"  # the Spark delta-spark 4.4 is built for (pyproject pins pyspark to it)
# The newest delta-spark on Maven Central built for Spark 4.2 (PyPI's 4.4.1 names a Maven artifact
# Central lacks; the Python package only wraps the JVM classes, so 4.4.0's is used with them).
DELTA_VERSION = "4.4.0"
DELTA_ARTIFACT = f"io.delta:delta-spark_4.2_2.13:{DELTA_VERSION}"
EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def delta_jars() -> list[Path]:
    """delta-spark's and delta-storage's jars, resolved through Maven on first use (then cached).

    Raises :class:`pipeline.jvm.JvmError` when they cannot be resolved (no Maven, no network).
    """
    jars = maven_classpath(f"delta-spark-{DELTA_VERSION}", [DELTA_ARTIFACT])
    mine = [j for j in jars if "/io/delta/delta-spark" in j.as_posix() or "/io/delta/delta-storage/" in j.as_posix()]
    if len(mine) != 2:
        raise JvmError(f"expected delta-spark and delta-storage among {DELTA_ARTIFACT}'s jars, got {mine}")
    return mine


def session_conf(jars: list[Path]) -> dict[str, str]:
    """The Spark settings that make a session a Delta session, with ``jars`` on its class path."""
    return {
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.sql.extensions": EXTENSION,
        "spark.sql.catalog.spark_catalog": CATALOG,
        # A snapshot's state is rebuilt on this many tasks (default 50): the job's tables are small
        # and read every micro-batch by the delta-spark writer.
        "spark.databricks.delta.snapshotPartitions": "2",
    }


def optional_session_conf() -> dict[str, str]:
    """:func:`session_conf` when the jars resolve; otherwise none, with a log line saying why (the
    ``deltalake`` writer does not need them)."""
    try:
        return session_conf(delta_jars())
    except JvmError as exc:
        log.warning("the Spark session runs without delta-spark: %s", exc)
        return {}


if __name__ == "__main__":  # pragma: no cover - the set-up's step: resolve once, then cached
    print(f"delta-spark {DELTA_VERSION} for Spark {SPARK_VERSION}: {', '.join(j.name for j in delta_jars())}")
