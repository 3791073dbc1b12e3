"""``faultwatch serve`` over real Delta tables, through real HTTP on loopback.

The tables are written with deltalake from a simulated broker outage (the report tests' stand-ins
for the queries); the server runs in-process on a free port and is called with urllib.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.config import Config, load_config
from pipeline.publish.sinks import write_cluster_files
from pipeline.serve import Server
from pipeline.serve.follow import latest_per_key, short_reason
from pipeline.serve.snapshot import Refresher, health
from pipeline.serve.state import avoided_brokers
from pipeline.simulate import run_to_memory
from schemas.tables import table
from tests.unit.test_report import _write, write_silver

CLUSTER = "DefaultCluster"


def serve_config(tmp_path: Path, **serve: Any) -> Config:
    """A config loaded from a file (so with read-only mappings, as users have it) on tmp_path."""
    conf = tmp_path / "loaded.toml"
    conf.write_text('[spark.conf]\n"spark.driver.memory" = "1g"\n'
                    '[lag.groups."CG_pay"]\nconsume_from_where = "CONSUME_FROM_FIRST_OFFSET"\n')
    cfg = load_config(conf, env={}).replace(
        storage__root=str(tmp_path / "tables"),
        storage__publish_dir=str(tmp_path / "avoidance"),
        serve__port=0,
        serve__refresh_interval_s=0.2,
    )
    return cfg.replace(**{f"serve__{k}": v for k, v in serve.items()})


def avoidance_doc(cluster: str, now_ms: int, broker: str = "broker-b") -> dict[str, Any]:
    entry = {"broker_name": broker, "avoid_until_ms": now_ms + 60_000, "expires_ms": now_ms + 180_000,
             "reason": "open_episode: quorum", "episode_id": f"{cluster}|{broker}|1", "multiplier": 1,
             "evidence": {"producers_avoiding": 5, "failure_rate": 0.4, "p99_latency_ms": 5.0}}
    return {"schema": "faultwatch.avoidance/1", "cluster": cluster, "cycle_id": "42", "policy_version": "1",
            "decided_ms": now_ms, "expires_ms": now_ms + 180_000, "brokers_known": 4, "max_avoid": 2,
            "capped": False, "avoid": [entry], "keep_available": []}


_RUNS: dict[int, Any] = {}


def outage_run() -> Any:
    """A 100 s broker-b outage that ended about now: simulated again once the last one is over a
    minute old, so its newest events stay well inside serve.max_data_age_s whatever ran before."""
    now_ms = int(time.time() * 1000)
    if not _RUNS or now_ms - _RUNS[1] > 60_000:
        _RUNS[0], _RUNS[1] = run_to_memory("broker-outage", duration_s=100.0, epoch_ms=now_ms - 100_000), now_ms
    return _RUNS[0]


def write_outage_tables(tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    """Silver tables of a broker-b outage, bronze send_results, and the published list."""
    now_ms = int(time.time() * 1000)
    sim, sink = outage_run()
    root = tmp_path / "tables"
    rows = write_silver(root, sim, sink)
    sends = [{**dataclasses.asdict(e), "event_date": "2026-01-01"} for e in sink.events("send_result")[-500:]]
    _write(root, "send_results", sends)
    rows["send_results"] = sends
    doc = avoidance_doc(CLUSTER, now_ms)
    write_cluster_files(str(tmp_path / "avoidance"), [(CLUSTER, orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))])
    return rows


def get(url: str, auth: str | None = None, context: Any = None) -> tuple[int, bytes, Message]:
    """Status, body and headers (looked up by name in any case, as HTTP names are)."""
    request = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def get_json(url: str, **kw: Any) -> tuple[int, Any]:
    status, body, _ = get(url, **kw)
    return status, json.loads(body)


def wait_refreshed(server: Server, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while server.refresher.snapshot is None:
        assert time.monotonic() < deadline, "no refresh finished"
        time.sleep(0.05)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, dict[str, list[dict[str, Any]]], Server]]:
    rows = write_outage_tables(tmp_path)
    server = Server(serve_config(tmp_path))
    url = server.start()
    wait_refreshed(server)
    yield url, rows, server
    server.stop()


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_follow_prometheus_conventions_and_match_the_tables(served: Any) -> None:
    url, rows, _ = served
    status, body, headers = get(url + "metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = metric_samples(body.decode())
    latest = max((r for r in rows["group_status"] if r["consumer_group"] == "CG_pay"), key=lambda r: r["ts_ms"])
    group = (("cluster", CLUSTER), ("group", "CG_pay"))
    assert samples[("faultwatch_group_lag_messages", group)] == latest["total_lag"]
    assert samples[("faultwatch_group_status", (*group, ("status", latest["status"])))] == 1.0
    assert sum(v for (n, labels), v in samples.items() if n == "faultwatch_group_status") == 1.0
    b = (("broker", "broker-b"), ("cluster", CLUSTER))
    assert samples[("faultwatch_broker_episodes_total", b)] == 1.0  # one confirmed episode, closed
    assert samples[("faultwatch_broker_episode_state", (*b, ("state", "none")))] == 1.0
    assert samples[("faultwatch_broker_avoidance_recommended", b)] == 1.0
    assert samples[("faultwatch_avoidance_brokers", (("cluster", CLUSTER),))] == 1.0
    health_b = max((h for h in rows["broker_health"] if h["broker_name"] == "broker-b"), key=lambda h: h["minute_ms"])
    assert samples[("faultwatch_broker_failure_ratio", b)] == pytest.approx(health_b["failure_rate"])
    assert samples[("faultwatch_broker_latency_p99_seconds", b)] == pytest.approx(health_b["latency_p99_ms"] / 1000)
    newest_send = max(r["ts_ms"] for r in rows["send_results"])
    assert samples[("faultwatch_table_newest_event_timestamp_seconds", (("table", "send_results"),))] == newest_send / 1000
    assert samples[("faultwatch_table_up", (("table", "publisher_cycles"),))] == 0.0  # never written
    queue_series = [k for k in samples if k[0] == "faultwatch_queue_lag_messages"]
    assert len(queue_series) == 16  # every queue of CG_pay, below the default bound of 100
    for name, _labels in samples:
        assert name.startswith("faultwatch_")
        assert not name.endswith("_ms"), name
    # Prometheus asks for gzip: the same text, compressed.
    request = urllib.request.Request(url + "metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(resp.read()) == body


def test_worst_queue_series_are_bounded(tmp_path: Path) -> None:
    write_outage_tables(tmp_path)
    refresher = Refresher(serve_config(tmp_path, max_queue_series=3))
    samples = metric_samples(refresher.refresh_once().metrics.decode())
    lags = sorted((v for (n, _), v in samples.items() if n == "faultwatch_queue_lag_messages"), reverse=True)
    assert len(lags) == 3
    snapshot_queues = refresher.snapshot.state.clusters[CLUSTER].groups["CG_pay"].queues  # type: ignore[union-attr]
    assert lags == sorted((q.lag for q in snapshot_queues), reverse=True)[:3]


def test_api_is_shaped_like_burrows(served: Any) -> None:
    url, rows, _ = served
    api = url + "v3/rocketmq"
    assert get_json(api) == (200, {"error": False, "message": "cluster list returned", "clusters": [CLUSTER],
                                   "request": {"url": "/v3/rocketmq"}})
    status, consumers = get_json(f"{api}/{CLUSTER}/consumer")
    assert status == 200 and consumers["consumers"] == ["CG_pay"]
    status, doc = get_json(f"{api}/{CLUSTER}/consumer/CG_pay/status")
    assert status == 200 and doc["error"] is False
    s = doc["status"]
    latest = max((r for r in rows["group_status"] if r["consumer_group"] == "CG_pay"), key=lambda r: r["ts_ms"])
    assert (s["group"], s["status"], s["totallag"]) == ("CG_pay", latest["status"], latest["total_lag"])
    assert s["queue_count"] == len(s["queues"]) == 16
    assert set(s["queues"][0]) >= {"topic", "broker", "queue_id", "status", "lag", "time_lag_ms", "owner"}
    assert s["maxlag"]["lag"] == max(q["lag"] for q in s["queues"])
    assert "complete" in s
    status, brokers = get_json(f"{api}/{CLUSTER}/broker")
    by_name = {b["broker"]: b for b in brokers["brokers"]}
    assert sorted(by_name) == ["broker-a", "broker-b", "broker-c", "broker-d"]
    assert by_name["broker-b"]["episodes_confirmed"] == 1 and by_name["broker-b"]["avoidance_recommended"]


def test_burrow_columns_of_group_status_are_used_when_present(tmp_path: Path) -> None:
    write_outage_tables(tmp_path)
    columns = {f.name for f in table("group_status").fields}
    row = {"cluster": CLUSTER, "consumer_group": "CG_burrow", "ts_ms": int(time.time() * 1000), "status": "WARN",
           "total_lag": 70, "queues": 2, "event_date": "2026-01-01", "complete": 0.5, "burrow_status": "WARN",
           "max_lag": 60, "maxlag_topic": "TopicPay", "maxlag_broker": "broker-c", "maxlag_queue_id": 3}
    _write(tmp_path / "tables", "group_status", [{k: v for k, v in row.items() if k in columns}])
    state = Refresher(serve_config(tmp_path)).refresh_once().state
    group = state.clusters[CLUSTER].groups["CG_burrow"]
    if "complete" not in columns:  # an older table: nothing to read, nothing invented
        assert group.complete is None
        return
    assert group.complete == 0.5 and group.extra.get("burrow_status") == "WARN"
    assert (group.worst.topic, group.worst.broker, group.worst.queue_id, group.worst.lag) == ("TopicPay", "broker-c", 3, 60)


def test_avoidance_answer_is_the_published_file(served: Any, tmp_path: Path) -> None:
    url, _, _ = served
    status, body, headers = get(f"{url}v3/rocketmq/{CLUSTER}/avoidance")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert body == (tmp_path / "avoidance" / f"{CLUSTER}.json").read_bytes()
    from jsonschema import validate

    from schemas.avoidance import WIRE_SCHEMA_PATH

    validate(json.loads(body), json.loads(WIRE_SCHEMA_PATH.read_text()))


@pytest.mark.parametrize("path,message", [
    ("v3/rocketmq/nope", "cluster 'nope' not found"),
    ("v3/rocketmq/nope/consumer", "cluster 'nope' not found"),
    (f"v3/rocketmq/{CLUSTER}/consumer/CG_nope/status", f"consumer group 'CG_nope' in cluster '{CLUSTER}' not found"),
    ("v3/rocketmq/nope/broker", "cluster 'nope' not found"),
    ("v3/rocketmq/nope/avoidance", "cluster 'nope' not found"),
    (f"v3/rocketmq/{CLUSTER}/whatever", "resource not found"),
])
def test_unknown_cluster_or_group_is_a_json_404(served: Any, path: str, message: str) -> None:
    url, _, _ = served
    status, doc = get_json(url + path)
    assert status == 404 and doc["error"] is True and doc["message"] == message


def test_the_api_is_read_only(served: Any) -> None:
    url, _, _ = served
    for method in ("POST", "PUT", "DELETE"):
        request = urllib.request.Request(url + "v3/rocketmq", method=method, data=b"{}")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10)
        assert err.value.code == 405


def test_healthz_is_200_while_fresh_and_503_with_the_reason_when_stale(served: Any, tmp_path: Path) -> None:
    url, _, server = served
    status, doc = get_json(url + "healthz")
    assert (status, doc) == (200, {"status": "ok", "reasons": []})
    # The same tables seen an hour later: too old.
    late = health(server.refresher.snapshot, server.cfg, int(time.time() * 1000) + 3_600_000)
    assert late[0] == 503
    assert any("table send_results: newest event is" in r and "limit 300 s" in r for r in late[1])
    assert any(r.startswith("last refresh finished") for r in late[1])


def test_missing_tables_give_503_and_an_error_field_never_a_crash(tmp_path: Path) -> None:
    server = Server(serve_config(tmp_path))
    url = server.start()
    try:
        wait_refreshed(server)
        status, doc = get_json(url + "healthz")
        assert status == 503 and any("table group_status does not exist" in r for r in doc["reasons"])
        status, doc = get_json(url + "v3/rocketmq")
        assert status == 503 and doc["error"] is True and "does not exist" in doc["message"]
        status, body, _ = get(url + "metrics")
        assert status == 200 and b'faultwatch_table_up{table="group_status"} 0.0' in body
        # The tables appear: the next refreshes pick them up.
        write_outage_tables(tmp_path)
        deadline = time.monotonic() + 20
        while get_json(url + "healthz")[0] != 200:
            assert time.monotonic() < deadline, get_json(url + "healthz")
            time.sleep(0.1)
        assert get_json(url + "v3/rocketmq")[1]["clusters"] == [CLUSTER]
    finally:
        server.stop()


def test_an_unreadable_table_gives_503_and_serving_goes_on(served: Any, tmp_path: Path) -> None:
    url, _, _ = served
    table_dir = tmp_path / "tables" / "queue_lag"
    _write(tmp_path / "tables", "queue_lag", [{"cluster": CLUSTER, "consumer_group": "CG_pay", "topic": "TopicPay",
                                               "broker_name": "broker-a", "queue_id": 0, "ts_ms": 1, "event_date": "x"}])
    newest = max(table_dir.rglob("*.parquet"), key=lambda p: p.stat().st_mtime)
    newest.write_bytes(b"not parquet at all")
    deadline = time.monotonic() + 20
    while get_json(url + "healthz")[0] != 503:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    status, doc = get_json(url + "healthz")
    assert any(r.startswith("table queue_lag unreadable") for r in doc["reasons"]), doc
    assert str(tmp_path) not in get(url + "healthz")[1].decode()  # no paths in answers
    status, doc = get_json(f"{url}v3/rocketmq/{CLUSTER}/consumer/CG_pay/status")
    assert status == 503 and doc["error"] is True and "queue_lag unreadable" in doc["message"]
    assert get(url + "metrics")[0] == 200 and get_json(f"{url}v3/rocketmq/{CLUSTER}/broker")[0] == 200


def test_refresh_reads_only_new_files_and_rebuilds_after_a_compaction(tmp_path: Path) -> None:
    write_outage_tables(tmp_path)
    refresher = Refresher(serve_config(tmp_path))
    first = refresher.refresh_once().state.clusters[CLUSTER].groups["CG_pay"]
    follower = refresher.followers["group_status"]
    seen = set(follower._seen)
    _write(tmp_path / "tables", "group_status", [{"cluster": CLUSTER, "consumer_group": "CG_pay",
                                                 "ts_ms": first.ts_ms + 1, "status": "STALL", "total_lag": 7,
                                                 "queues": 16,
                                                 "event_date": time.strftime("%Y-%m-%d", time.gmtime(first.ts_ms / 1000))}])
    second = refresher.refresh_once().state.clusters[CLUSTER].groups["CG_pay"]
    assert (second.status, second.total_lag) == ("STALL", 7) and len(follower._seen - seen) == 1
    from deltalake import DeltaTable

    table = DeltaTable(str(tmp_path / "tables" / "group_status"))
    assert table.optimize.compact()["numFilesRemoved"] > 0
    third = refresher.refresh_once().state.clusters[CLUSTER].groups["CG_pay"]
    table.update_incremental()
    assert third == second
    assert follower._seen == set(pa.table(table.get_add_actions()).column("path").to_pylist())


@pytest.mark.parametrize("keys,rows,expected", [
    (["k"], [("a", 1), ("a", 3), ("b", 2), ("a", 2)], [("a", 3), ("b", 2)]),
    (["k"], [("a", 1), ("a", 1)], [("a", 1)]),
    ([], [("a", 1), ("b", 5), ("c", 2)], [("b", 5)]),
    (["k"], [], []),
])
def test_latest_per_key(keys: list[str], rows: list[tuple[str, int]], expected: list[tuple[str, int]]) -> None:
    table = pa.table({"k": pa.array([r[0] for r in rows], pa.string()), "t": pa.array([r[1] for r in rows], pa.int64())})
    out = latest_per_key(keys, "t")(table)
    assert sorted(zip(out.column("k").to_pylist(), out.column("t").to_pylist())) == expected


def test_avoided_brokers_follow_the_wire_format_rules() -> None:
    doc = avoidance_doc(CLUSTER, 1_000)
    assert avoided_brokers(doc, 1_000) == ["broker-b"]
    assert avoided_brokers(doc, 61_000) == []  # entry's avoid_until passed
    assert avoided_brokers({**doc, "expires_ms": 2_000}, 2_000) == []  # the whole list expired


def wait_for(check: Any, what: str, timeout_s: float = 30.0) -> Any:
    """Poll ``check()`` until it returns something truthy (the event itself), within a generous bound."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not seen within {timeout_s} s"
        time.sleep(0.05)


def unhealthy_reasons(url: str) -> list[str] | None:
    """/healthz's reasons while it is 503 (None while 200)."""
    status, doc = get_json(url + "healthz")
    return doc["reasons"] if status == 503 else None


def test_a_table_that_disappears_is_noticed_at_the_next_refresh_and_recovers(served: Any, tmp_path: Path) -> None:
    url, _, _ = served
    up = b'faultwatch_table_up{table="group_status"} '
    assert up + b"1.0" in get(url + "metrics")[1]
    table_dir = tmp_path / "tables" / "group_status"
    table_dir.rename(tmp_path / "moved-away")
    reasons = wait_for(lambda: unhealthy_reasons(url), "healthz 503")
    assert reasons == ["table group_status does not exist"]
    assert str(tmp_path) not in get(url + "healthz")[1].decode()  # no paths in answers
    assert up + b"0.0" in get(url + "metrics")[1]
    status, doc = get_json(f"{url}v3/rocketmq/{CLUSTER}/consumer")
    assert (status, doc["message"]) == (503, "table group_status does not exist")
    (tmp_path / "moved-away").rename(table_dir)
    wait_for(lambda: get_json(url + "healthz") == (200, {"status": "ok", "reasons": []}), "healthz 200 again")
    assert up + b"1.0" in get(url + "metrics")[1]
    assert get_json(f"{url}v3/rocketmq/{CLUSTER}/consumer")[1]["consumers"] == ["CG_pay"]


def test_one_bad_avoidance_file_is_named_and_the_others_still_refresh(served: Any, tmp_path: Path) -> None:
    url, _, _ = served
    folder = tmp_path / "avoidance"
    now_ms = int(time.time() * 1000)
    bad = {**avoidance_doc("Other", now_ms), "decided_ms": "yesterday"}
    (folder / "Other.json").write_bytes(orjson.dumps(bad))
    (folder / "Broken.json").write_bytes(b"{not json")
    newer = orjson.dumps(avoidance_doc(CLUSTER, now_ms + 1, broker="broker-c"), option=orjson.OPT_SORT_KEYS)
    write_cluster_files(str(folder), [(CLUSTER, newer)])
    wait_for(lambda: get(f"{url}v3/rocketmq/{CLUSTER}/avoidance")[1] == newer, "the good file's new content")
    reasons = wait_for(lambda: unhealthy_reasons(url), "healthz naming the bad files")
    with pytest.raises(orjson.JSONDecodeError) as not_json:
        orjson.loads(b"{not json")
    assert reasons == [f"avoidance file Broken.json: not JSON: {not_json.value}",
                       "avoidance file Other.json: decided_ms is not an integer"]
    samples = metric_samples(get(url + "metrics")[1].decode())
    unusable = {k[1]: v for k, v in samples.items() if k[0] == "faultwatch_avoidance_file_unusable"}
    assert unusable == {(("file", "Broken.json"),): 1.0, (("file", "Other.json"),): 1.0}
    assert samples[("faultwatch_broker_avoidance_recommended", (("broker", "broker-c"), ("cluster", CLUSTER)))] == 1.0
    assert get_json(f"{url}v3/rocketmq/Other/avoidance")[0] == 404  # the bad file names no cluster serve can trust
    (folder / "Other.json").unlink()
    (folder / "Broken.json").unlink()
    wait_for(lambda: get_json(url + "healthz")[0] == 200, "healthz 200 once the bad files are gone")


def _segment_state(tmp_path: Path) -> None:
    """Clusters and groups whose names look like paths."""
    now_ms = int(time.time() * 1000)
    names = [f"{CLUSTER}/consumer", "..", "a%2fb"]
    write_cluster_files(str(tmp_path / "avoidance"), [
        (n, orjson.dumps(avoidance_doc(n, now_ms, broker=f"broker-of-{n}"))) for n in names])
    _write(tmp_path / "tables", "group_status", [
        {"cluster": CLUSTER, "consumer_group": g, "ts_ms": now_ms, "status": "OK", "total_lag": 0, "queues": 0,
         "event_date": "2026-01-01"} for g in ("CG_pay/status", "..")])


def test_names_are_path_segments_and_reach_no_other_resource(served: Any, tmp_path: Path) -> None:
    url, _, server = served
    _segment_state(tmp_path)
    api = url + "v3/rocketmq"
    wait_for(lambda: len(get_json(api)[1]["clusters"]) == 4, "the new clusters")
    assert get_json(api)[1]["clusters"] == sorted([CLUSTER, f"{CLUSTER}/consumer", "..", "a%2fb"])
    # The cluster named "DefaultCluster/consumer" does not replace DefaultCluster's consumer list.
    status, doc = get_json(f"{api}/{CLUSTER}/consumer")
    assert status == 200 and sorted(doc["consumers"]) == sorted(["CG_pay", "CG_pay/status", ".."])
    for encoded in (f"{CLUSTER}%2Fconsumer", f"{CLUSTER}%2fconsumer"):
        status, doc = get_json(f"{api}/{encoded}")
        assert (status, doc["cluster"]["name"]) == (200, f"{CLUSTER}/consumer")
        status, doc = get_json(f"{api}/{encoded}/avoidance")
        assert (status, doc["cluster"]) == (200, f"{CLUSTER}/consumer")
    assert get_json(f"{api}/%2E%2E/avoidance")[1]["cluster"] == ".."
    assert get_json(f"{api}/a%252fb/avoidance")[1]["cluster"] == "a%2fb"
    assert get_json(f"{api}/a%2fb/avoidance")[0] == 404  # that is "a/b": no such cluster
    status, doc = get_json(f"{api}/{CLUSTER}/consumer/CG_pay%2Fstatus/status")
    assert (status, doc["status"]["group"]) == (200, "CG_pay/status")
    status, doc = get_json(f"{api}/{CLUSTER}/consumer/CG_pay/status")
    assert (status, doc["status"]["group"]) == (200, "CG_pay")
    assert get_json(f"{api}/{CLUSTER}/consumer/%2E%2E/status")[1]["status"]["group"] == ".."
    # The paths the refresh rendered are the encoded ones.
    snap = server.refresher.snapshot
    assert "/v3/rocketmq/DefaultCluster%2Fconsumer/avoidance" in snap.answers
    assert "/v3/rocketmq/%2E%2E/avoidance" in snap.answers
    assert not any(p.startswith("/v3/rocketmq/DefaultCluster/consumer/") and "%" not in p and p.count("/") > 6
                   for p in snap.answers)


def test_error_texts_keep_the_first_line_without_the_table_location() -> None:
    error = OSError("Generic error at /srv/tables/queue_lag/part-1.parquet: bad magic\nBacktrace:\n  0: rust frame")
    assert short_reason(error, "/srv/tables/queue_lag") == "Generic error at <table>/part-1.parquet: bad magic"
    assert short_reason(ValueError("x" * 500), "/t").endswith("...") and len(short_reason(ValueError("x" * 500), "/t")) == 200
