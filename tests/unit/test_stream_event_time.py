"""The combined query's plain parts: settle points, keyed feeds, the state blob, checkpoint checks."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.config import Config, ConfigError
from streaming.combined_query import pack, unpack
from streaming.feeds import FAULTS, LAG, key_of, lag_feed, parts_of, plain, split_by
from streaming.kafka_source import SETTLE, partition_offsets, settle_point

DELAY = 30_000
T0 = 1_700_000_000_000


def times(table: dict[tuple[str, int], int | None]):  # type: ignore[no-untyped-def]
    asked = []

    def ts_at(wanted: list[tuple[str, int, bool]]) -> dict:
        asked.extend(wanted)
        return {(k, o): table.get((k, o)) for k, o, _ in wanted}

    return ts_at, asked


def test_a_backlog_settles_at_the_slowest_partition_still_being_read() -> None:
    # p0 read to offset 100 (next record at T0+50 s), p1 to 400 (next at T0+200 s): p0 is behind
    start = {"t/0": 0, "t/1": 0}
    end = {"t/0": 100, "t/1": 400}
    latest = {"t/0": 1000, "t/1": 1000}
    ts_at, asked = times({("t/0", 100): T0 + 50_000, ("t/1", 400): T0 + 200_000})
    assert settle_point(start, end, latest, ts_at, DELAY, 2 * T0) == T0 + 50_000 - DELAY
    assert sorted(asked) == [("t/0", 100, False), ("t/1", 400, False)]  # next unread records


def test_read_to_the_end_it_follows_the_newest_record_read() -> None:
    start = {"t/0": 0, "t/1": 0, "t/2": 7}
    end = {"t/0": 100, "t/1": 400, "t/2": 7}  # t/2 had nothing new
    ts_at, asked = times({("t/0", 99): T0 + 10_000, ("t/1", 399): T0 + 90_000})
    assert settle_point(start, end, dict(end), ts_at, DELAY, 2 * T0) == T0 + 90_000 - DELAY
    assert sorted(asked) == [("t/0", 99, True), ("t/1", 399, True)]  # last records read


def test_a_caught_up_partition_does_not_hold_back_one_that_is_behind() -> None:
    start = {"a/0": 0, "b/0": 0}
    end = {"a/0": 50, "b/0": 100}  # a/0 is read to its end; b/0 still has records
    ts_at, _ = times({("a/0", 49): T0, ("b/0", 100): T0 + 500_000})
    assert settle_point(start, end, {"a/0": 50, "b/0": 900}, ts_at, DELAY, 2 * T0) == T0 + 500_000 - DELAY


def test_it_never_goes_back_nor_past_the_ceiling_and_waits_for_an_unknown_position() -> None:
    start = {"t/0": 0, SETTLE: T0}
    ts_at, _ = times({("t/0", 10): T0 - 60_000})
    assert settle_point(start, {"t/0": 10}, {"t/0": 99}, ts_at, DELAY, 2 * T0) == T0
    ts_at, _ = times({("t/0", 10): T0 + 10**9})
    assert settle_point(start, {"t/0": 10}, {"t/0": 99}, ts_at, DELAY, T0 + 5) == T0 + 5
    ts_at, _ = times({})  # the next record's time is unknown (no readable event time)
    assert settle_point(start, {"t/0": 10}, {"t/0": 99}, ts_at, DELAY, 2 * T0) == T0


def test_meta_entries_are_not_partitions() -> None:
    assert partition_offsets({"t/0": 5, SETTLE: 9}) == {"t/0": 5}


def test_rows_are_cut_by_key_in_sorted_order_whatever_their_order() -> None:
    rows = pa.table({"cluster": ["b", "a", "b", "a", "c"], "v": [1, 2, 3, 4, 5]})
    got = [(k, t.column("v").to_pylist()) for k, t in split_by(rows, ("cluster",))]
    assert got == [(("a",), [2, 4]), (("b",), [1, 3]), (("c",), [5])]
    assert split_by(rows.slice(0, 0), ("cluster",)) == []


def test_lag_feed_sends_progress_to_its_groups_shard_and_sends_to_every_shard() -> None:
    sends = pa.table({c: pa.array([None, None], pa.int64()) for c in
                      ("ts_ms", "queue_id", "queue_offset", "kafka_partition", "kafka_offset", "kafka_ts_ms")}
                     | {c: ["c1", "c1"] if c == "cluster" else ["x", "y"] for c in
                        ("cluster", "topic", "broker_name", "status", "kafka_topic")})
    progress = pa.table({c: ["c1"] * 3 if c == "cluster" else ["G1", "G2", "G1"] if c == "consumer_group"
                         else ["x"] * 3 for c in ("cluster", "consumer_group", "topic", "broker_name", "client_id",
                                                  "kafka_topic")}
                        | {c: pa.array([1, 2, 3], pa.int64()) for c in
                           ("ts_ms", "queue_id", "consumer_offset", "broker_offset", "last_timestamp_ms",
                            "kafka_partition", "kafka_offset", "kafka_ts_ms")})
    pieces = lag_feed({"send_results": sends, "consumer_progress": progress}, shards=4)
    by_table: dict[str, list[str]] = {}
    for key, name, rows in pieces:
        assert parts_of(key)[:2] == [LAG, "c1"]
        by_table.setdefault(name, []).append(parts_of(key)[2])
        assert plain(rows).num_rows == rows.num_rows
    assert sorted(by_table["send_results"]) == ["0", "1", "2", "3"]
    g1 = [k for k, n, r in pieces if n == "consumer_progress" and "G1" in r.column("consumer_group").to_pylist()]
    assert len(g1) == 1 and sum(r.num_rows for _, n, r in pieces if n == "consumer_progress") == 3


def test_fault_feed_keeps_each_broker_under_one_shard_of_its_cluster() -> None:
    from pipeline.faults import EVENT_COLUMNS, from_send_results
    from streaming.feeds import fault_feed, shard_of
    from tests.doubles.faults_synth import bronze_table, random_stream

    sends = bronze_table(from_send_results(random_stream(1, brokers=12, events=600)
                                           + random_stream(2, brokers=3, events=200, cluster="c2")))
    for shards in (1, 4, 12):
        pieces = fault_feed(sends, EVENT_COLUMNS, shards)
        keys = [parts_of(key)[1:] for key, _, _ in pieces]
        assert keys == sorted(keys)  # in the sorted order of the keys' strings ("10" before "2")
        seen: dict[tuple[str, str], str] = {}
        for key, name, rows in pieces:
            concern, cluster, shard, _ = parts_of(key)
            assert (concern, name) == (FAULTS, "send_results") and 0 <= int(shard) < shards
            for broker in set(plain(rows).column("broker_name").to_pylist()):
                assert seen.setdefault((cluster, broker), shard) == shard
                assert shard == str(shard_of(pa.array([broker]), shards)[0])
            assert set(plain(rows).column("cluster").to_pylist()) == {cluster}
        assert sum(r.num_rows for _, _, r in pieces) == sends.num_rows
        assert len(seen) == 15 and len(pieces) <= (2 if shards == 1 else 2 * shards)
    assert len({s for (c, _), s in seen.items() if c == "c1"}) > 1  # 12 brokers over 12 shards


def test_a_ranges_fault_pieces_hold_the_rows_its_fetches_would() -> None:
    import json

    from pipeline.faults import EVENT_COLUMNS, from_send_results
    from streaming.feeds import fault_feed
    from streaming.kafka_source import _keyed_feeds
    from tests.doubles.faults_synth import bronze_table, random_stream

    sends = bronze_table(from_send_results(random_stream(3, brokers=9, events=900)))
    fetches = [sends.slice(0, 250), sends.slice(250, 400), sends.slice(650)]
    feeds = _keyed_feeds({"feeds": json.dumps(["faults"]), "feed_columns": json.dumps(list(EVENT_COLUMNS)),
                          "fault_shards": "4"})
    assert feeds is not None and feeds.per_fetch({"send_results": fetches[0]}) == []

    def by_key(pieces: list) -> dict:
        out: dict = {}
        for key, name, rows in pieces:
            out.setdefault((key, name), []).extend(plain(rows).to_pylist())
        return out

    whole = feeds.per_range({"send_results": pa.Table.from_batches([b for f in fetches for b in f.to_batches()])})
    assert by_key(whole) == by_key([p for f in fetches for p in fault_feed(f, EVENT_COLUMNS, 4)])
    assert len(whole) <= 4


def test_keys_name_their_concern() -> None:
    assert parts_of(key_of(FAULTS, "c1")) == [FAULTS, "c1"]


def test_spark_hash_is_sparks() -> None:
    """Values of Spark 4's ``hash()`` (tests/spark/test_combined_query.py compares many more)."""
    from streaming.feeds import spark_hash

    assert [spark_hash(k.encode()) for k in ("", "a", "abcde", "f\x1fc1\x1f0", "é")] == \
        [142593372, 1485273170, 814637928, -899515064, 2119106806]


@pytest.mark.parametrize("partitions", [1, 2, 4, 8, 16])
def test_a_clusters_shards_are_placed_evenly_over_the_partitions(partitions: int) -> None:
    from streaming.feeds import PLACES, placed, spark_hash

    for cluster in ("c1", "DefaultCluster", "集群"):
        for concern, shards in ((FAULTS, 8), (FAULTS, 16), (LAG, 4)):
            keys = [placed(concern, cluster, s) for s in range(shards)]
            assert [parts_of(k)[:3] for k in keys] == [[concern, cluster, str(s)] for s in range(shards)]
            at = [spark_hash(k.encode()) % PLACES % partitions for k in keys]
            assert max(map(at.count, set(at))) - min(at.count(p) for p in range(partitions)) <= 1


@pytest.mark.parametrize("values", [(), (1, "a", b"\x00\xff", None, -5, ""), (2**62, "é" * 3, b"")])
def test_the_state_blob_round_trips(values: tuple) -> None:
    assert unpack(pack(values)) == values


def _cfg(tmp_path: Path) -> Config:
    return Config().replace(storage__root=str(tmp_path / "tables"), storage__checkpoint_root=str(tmp_path / "ck"))


def test_a_checkpoint_of_another_state_layout_is_refused(tmp_path: Path) -> None:
    from streaming.delta_sink import LAYOUT_FILE, check_layout

    ck = tmp_path / "ck" / "combined"
    check_layout(str(ck), "combined", 1)  # a new checkpoint is marked
    assert (ck / LAYOUT_FILE).exists()
    (ck / "metadata").write_text("{}")  # Spark started a query there
    check_layout(str(ck), "combined", 1)
    with pytest.raises(ConfigError, match="layout 1.*layout 2"):
        check_layout(str(ck), "combined", 2)
    old = tmp_path / "ck" / "bronze_faults"
    old.mkdir()
    (old / "metadata").write_text("{}")  # written before layouts were marked
    with pytest.raises(ConfigError, match="layout 0"):
        check_layout(str(old), "bronze_faults", 1)


def test_a_checkpoint_keyed_with_other_shards_is_refused_naming_the_setting(tmp_path: Path) -> None:
    from streaming.combined_query import state_keys
    from streaming.delta_sink import LAYOUT_FILE, check_layout

    cfg = Config()
    ck = tmp_path / "ck" / "combined"
    check_layout(str(ck), "combined", 6, state_keys(cfg, ["faults", "lag"]))
    (ck / "metadata").write_text("{}")
    check_layout(str(ck), "combined", 6, state_keys(cfg, ["faults", "lag"]))  # the same settings: accepted
    fewer = cfg.replace(faults__shards=4)
    with pytest.raises(ConfigError, match=r"faults\.shards is 4, .*faults\.shards = 8 again"):
        check_layout(str(ck), "combined", 6, state_keys(fewer, ["faults", "lag"]))
    with pytest.raises(ConfigError, match=r"lag\.shards is 3"):
        check_layout(str(ck), "combined", 6, state_keys(cfg.replace(lag__shards=3), ["faults", "lag"]))
    # a checkpoint marked before the settings were recorded takes today's, then holds to them
    old = tmp_path / "ck" / "older"
    old.mkdir()
    (old / "metadata").write_text("{}")
    (old / LAYOUT_FILE).write_text(json.dumps({"query": "combined", "layout": 6}))
    check_layout(str(old), "combined", 6, state_keys(cfg, ["faults"]))
    assert json.loads((old / LAYOUT_FILE).read_text())["keys"] == {"faults.shards": 8}
    with pytest.raises(ConfigError, match="faults.shards is 4"):
        check_layout(str(old), "combined", 6, state_keys(fewer, ["faults"]))
    # the lag query has no layout number: only its key setting is held
    lag = tmp_path / "ck" / "lag"
    lag.mkdir()
    (lag / "metadata").write_text("{}")
    check_layout(str(lag), "lag", None, {"lag.shards": 2})
    with pytest.raises(ConfigError, match="lag.shards is 1"):
        check_layout(str(lag), "lag", None, {"lag.shards": 1})
    fresh = tmp_path / "ck" / "lag-new"
    check_layout(str(fresh), "lag", None, {"lag.shards": 2})  # a new one is marked layout 0
    assert json.loads((fresh / LAYOUT_FILE).read_text()) == {"query": "lag", "layout": 0, "keys": {"lag.shards": 2}}


def test_tables_another_query_wrote_are_refused(tmp_path: Path) -> None:
    from deltalake import DeltaTable
    from deltalake.transaction import CommitProperties, Transaction

    from streaming.delta_sink import app_id, check_other_writers, ensure_tables

    cfg = _cfg(tmp_path)
    ensure_tables(cfg.storage.root, ["send_results", "quarantine"])
    check_other_writers(cfg, "combined", ["send_results", "quarantine"])
    for name in ("send_results", "quarantine"):
        DeltaTable(str(Path(cfg.storage.root) / name)).create_write_transaction(
            [], mode="append", schema=DeltaTable(str(Path(cfg.storage.root) / name)).schema(),
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id(cfg, "bronze_faults"), 3)]))
    with pytest.raises(ConfigError, match="send_results.*'bronze_faults'.*--only bronze_faults"):
        check_other_writers(cfg, "combined", ["send_results", "quarantine"])
    check_other_writers(cfg, "lag", ["quarantine"])  # every query writes its own rejects there
    check_other_writers(cfg, "bronze_faults", ["send_results"])
