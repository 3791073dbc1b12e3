"""Executor Python workers fork from faultwatch's daemon, so they start with its modules imported."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.spark


def _what_the_worker_has(batches: Any) -> Any:
    import gc
    import sys

    import pyarrow as pa

    for _ in batches:
        pass
    main = getattr(sys.modules["__main__"], "__spec__", None)
    yield pa.RecordBatch.from_pydict({"main": [main.name if main else ""],
                                      "preloaded": ["streaming.kafka_source" in sys.modules],
                                      "frozen": [gc.get_freeze_count()]})


def test_executor_workers_fork_from_the_preloading_daemon(spark: Any) -> None:
    rows = spark.range(2, numPartitions=2).mapInArrow(
        _what_the_worker_has, "main string, preloaded boolean, frozen long").collect()
    assert {(r["main"], r["preloaded"]) for r in rows} == {("streaming.daemon", True)}
    # the preloaded modules' objects are out of the per-task gc.collect()'s reach
    assert min(r["frozen"] for r in rows) > 10_000


def test_local_checkpoints_use_the_file_system_manager(spark: Any) -> None:
    """Spark's FileContext-based default forks chmod/readlink per checkpoint file (no native Hadoop)."""
    from streaming.session import LOCAL_CHECKPOINT_MANAGER

    assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass") == LOCAL_CHECKPOINT_MANAGER


def test_a_free_executor_takes_a_stateful_task_without_the_locality_wait(spark: Any) -> None:
    """Spark's 3 s default would let a cluster's micro-batch wait for the executor holding a state store."""
    assert spark.sparkContext.getConf().get("spark.locality.wait") == "0s"


def test_python_workers_are_reached_over_unix_domain_sockets(spark: Any) -> None:
    """Each Python runner connects anew; a Unix domain socket is cheaper than loopback TCP."""
    import pyarrow as pa

    assert spark.sparkContext.getConf().get("spark.python.unix.domain.socket.enabled") == "true"

    def where(batches: Any) -> Any:
        import os

        for _ in batches:
            yield pa.RecordBatch.from_pydict({"uds": [os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "").lower()]})

    rows = spark.range(4, numPartitions=2).mapInArrow(where, "uds string").collect()
    assert {r["uds"] for r in rows} == {"true"}
