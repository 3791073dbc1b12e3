"""The live oracle on a real cluster: after a broker is SIGKILLed, each real producer's own fault
table (its ``LatencyFaultToleranceImpl`` items, read from the running client) equals faultwatch's
``producer_fault_windows_live`` for that producer, computed from the hook's events alone.

Tolerance: a window's end must equal the client's avoid-until within ``TOLERANCE_MS``. Both come from
the same JVM clock: the hook stamps ``ts_ms`` in its after-call and the client computes
``now + duration`` in ``updateFaultItem`` right after the hook returns, so the client's value is the
later one, by the hook's own run time (well under a millisecond when idle; 50 ms covers a busy
two-core machine and a GC pause).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import Config
from pipeline.deltaio import latest_revision, read_table
from pipeline.rocketmq_cluster import RocketMQCluster
from tests.conftest import unique_topics
from tests.integration.processes import BIN, REPO, wait_for, write_config

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TOLERANCE_MS = 50


def in_force(snapshot: dict[str, Any]) -> dict[str, int]:
    """Broker -> avoid-until of the client's items still unavailable at the snapshot."""
    return {i["broker_name"]: i["start_timestamp"] for i in snapshot["items"]
            if i["start_timestamp"] > snapshot["now_ms"]}


def test_each_producers_fault_table_equals_faultwatchs_windows_after_a_kill(  # type: ignore[no-untyped-def]
    kafka, cfg: Config, tmp_path: Path, rocketmq: RocketMQCluster, rmq_topic: str, driver
) -> None:
    cfg = unique_topics(cfg, kafka, "oracle")
    drivers = {v: driver(v, topic=rmq_topic, kafka=kafka.bootstrap, results_topic=cfg.topics.send_results)
               for v in ("4.9.8", "5.3.3")}
    for d in drivers.values():
        assert d.command("send 24")["failed"] == 0
        # a first connection can take >550 ms, and so open a 30 s window before the kill: let those end
        wait_for(lambda d=d: not in_force(d.command("faults")), 40, "warm-up windows to end")
    rocketmq.kill("broker-c")
    try:
        snapshots = {}
        for v, d in drivers.items():
            sent = d.command("send 24")
            assert sent["failed"] == 0 and "broker-c" not in sent["by_broker"], sent  # retries went elsewhere
            snapshots[v] = d.command("faults")
        for d in drivers.values():
            assert d.command("flush")["dropped"] == 0
    finally:
        rocketmq.restart("broker-c")

    conf = write_config(cfg, tmp_path / "fw.toml")
    done = subprocess.run([str(BIN / "faultwatch"), "stream", "--config", str(conf), "--once"],
                          cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    windows = latest_revision(read_table(cfg.storage.root, "producer_fault_windows_live"), "window_id").to_pylist()

    matched = total = 0
    for version, snap in snapshots.items():
        client = in_force(snap)
        assert "broker-c" in client, (version, snap)  # the kill opened a window in the real client
        ours = {w["broker_name"]: w["end_ms"] for w in windows
                if w["client_id"] == snap["client_id"] and w["state"] != "retracted"
                and w["start_ms"] <= snap["now_ms"] < w["end_ms"]}
        assert set(ours) == set(client), (version, client, ours)
        for broker, until in client.items():
            total += 1
            matched += 0 <= until - ours[broker] <= TOLERANCE_MS
        print(f"oracle {version}: client {client} faultwatch {ours}")
    print(f"oracle: {matched}/{total} fault items matched within {TOLERANCE_MS} ms")
    assert matched == total
