"""The Kafka reader's offset logic against the real broker (no Spark needed for these)."""

from __future__ import annotations

import json

import pytest
from kafka import KafkaProducer
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from pipeline.config import Config
from pipeline.kafka_local import create_topics
from streaming.kafka_source import (
    _CONSUMERS,
    SECRET_OPTION,
    KafkaEventReader,
    TopicPartitionRange,
    _cap_rows,
    consumer_key,
)

pytestmark = pytest.mark.kafka


def reader(kafka, topic: str, **options: str) -> KafkaEventReader:  # type: ignore[no-untyped-def]
    cfg = Config().replace(kafka__bootstrap_servers=kafka.bootstrap, kafka__connect_timeout_s=5.0)
    return KafkaEventReader(
        {
            "topics": json.dumps({topic: "send_result"}),
            SECRET_OPTION: json.dumps(cfg.kafka.client_options()),
            "connect_timeout_s": "5",
            **options,
        }
    )


def produce(kafka, topic: str, per_partition: dict[int, int]) -> None:  # type: ignore[no-untyped-def]
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=50, batch_size=1 << 20)
    for partition, n in per_partition.items():
        for i in range(n):
            producer.send(topic, value=b"{}", partition=partition)
    producer.flush()
    producer.close()


def test_end_offsets_are_exact_even_where_list_offsets_is_wrong(kafka) -> None:  # type: ignore[no-untyped-def]
    create_topics(kafka.bootstrap, ["src.ends"], 2)
    produce(kafka, "src.ends", {0: 1000, 1: 7})  # batched: Tansu's ListOffsets answers 1, not 1000
    r = reader(kafka, "src.ends")
    try:
        start = r.initialOffset()
        assert start == {"src.ends/0": 0, "src.ends/1": 0}
        assert r.latestOffset(start, ReadAllAvailable()) == {"src.ends/0": 1000, "src.ends/1": 7}
        produce(kafka, "src.ends", {0: 5})
        assert r.latestOffset(start, ReadAllAvailable())["src.ends/0"] == 1005
    finally:
        r.stop()


def test_end_offsets_take_one_or_two_polls_while_producers_append(kafka) -> None:  # type: ignore[no-untyped-def]
    import threading
    import time

    create_topics(kafka.bootstrap, ["src.busy"], 4)
    stop = threading.Event()
    sent = [0]

    def append() -> None:
        producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=5)
        while not stop.is_set():
            producer.send("src.busy", value=b"{}", partition=sent[0] % 4)
            sent[0] += 1
        producer.flush()
        producer.close()

    def appended_since(count: int) -> None:
        """Wait until the producer has sent records past ``count``: each look-up runs during appends."""
        deadline = time.monotonic() + 30
        while sent[0] <= count + 100:
            assert thread.is_alive(), "the producer thread ended"
            assert time.monotonic() < deadline, f"no appends within 30 s ({sent[0]} sent)"
            time.sleep(0.005)

    thread = threading.Thread(target=append)
    thread.start()
    r = reader(kafka, "src.busy", end_offsets="fetch")  # the path brokers with a short ListOffsets answer take
    polls = []
    try:
        start = r.initialOffset()
        for _ in range(10):
            appended_since(sent[0])
            r.latestOffset(start, ReadAllAvailable())
            polls.append(r.end_polls)
    finally:
        stop.set()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the producer thread did not stop within 60 s"
    try:
        # The records fetched past the ends are dropped all at once: one record per poll left the
        # rest buffered, and a partition with buffered records is not fetched again, so its high
        # watermark stayed old for dozens of polls.
        assert max(polls) <= 3, polls
        assert sum(r.latestOffset(start, ReadAllAvailable()).values()) == sent[0]  # exact once appends stop
    finally:
        r.stop()


def test_a_topic_created_later_is_picked_up_from_its_beginning(kafka) -> None:  # type: ignore[no-untyped-def]
    r = reader(kafka, "src.later")
    try:
        start = r.initialOffset()
        assert start == {}  # does not exist yet: nothing to read, no crash
        assert r.latestOffset(start, ReadAllAvailable()) == {}
        create_topics(kafka.bootstrap, ["src.later"], 3)
        produce(kafka, "src.later", {0: 3, 2: 4})
        end = r.latestOffset(start, ReadAllAvailable())
        assert end == {"src.later/0": 3, "src.later/1": 0, "src.later/2": 4}
        assert r.partitions(start, end) == [  # the longest first
            TopicPartitionRange("src.later", 2, "send_result", 0, 4),
            TopicPartitionRange("src.later", 0, "send_result", 0, 3),
        ]
    finally:
        r.stop()


def test_admission_control_caps_rows_per_batch(kafka) -> None:  # type: ignore[no-untyped-def]
    create_topics(kafka.bootstrap, ["src.cap"], 2)
    produce(kafka, "src.cap", {0: 300, 1: 100})
    r = reader(kafka, "src.cap", max_rows="100")
    try:
        limit = r.getDefaultReadLimit()
        assert isinstance(limit, ReadMaxRows) and limit.max_rows == 100
        start = r.initialOffset()
        end = r.latestOffset(start, limit)
        assert end == {"src.cap/0": 75, "src.cap/1": 25}  # shared by backlog
        end2 = r.latestOffset(end, ReadAllAvailable())  # an availableNow catch-up ignores the cap
        assert end2 == {"src.cap/0": 300, "src.cap/1": 100}
    finally:
        r.stop()


def test_available_now_stops_at_the_target_seen_at_start(kafka) -> None:  # type: ignore[no-untyped-def]
    create_topics(kafka.bootstrap, ["src.once"], 1)
    produce(kafka, "src.once", {0: 10})
    r = reader(kafka, "src.once")
    try:
        start = r.initialOffset()
        r.prepareForTriggerAvailableNow()
        produce(kafka, "src.once", {0: 10})  # arrives after --once started: left for the next run
        assert r.latestOffset(start, ReadAllAvailable()) == {"src.once/0": 10}
    finally:
        r.stop()


@pytest.mark.parametrize(
    "start, end, cap, expected",
    [
        ({"a/0": 0}, {"a/0": 10}, 100, {"a/0": 10}),
        ({"a/0": 0, "a/1": 0}, {"a/0": 90, "a/1": 10}, 10, {"a/0": 9, "a/1": 1}),
        ({"a/0": 5}, {"a/0": 5, "a/1": 1000}, 10, {"a/0": 5, "a/1": 10}),
        ({"a/0": 0, "a/1": 0}, {"a/0": 1000, "a/1": 1}, 10, {"a/0": 9, "a/1": 1}),  # each partition moves
    ],
)
def test_cap_rows_table(start: dict, end: dict, cap: int, expected: dict) -> None:
    assert _cap_rows(start, end, cap) == expected


@pytest.mark.parametrize(
    "begin, end, cap, expected",
    [
        (0, 10, 0, [(0, 10)]),
        (0, 10, 10, [(0, 10)]),
        (0, 10, 4, [(0, 3), (3, 6), (6, 10)]),
        (5, 105, 50, [(5, 55), (55, 105)]),
    ],
)
def test_split_range_table(begin: int, end: int, cap: int, expected: list) -> None:
    from streaming.kafka_source import split_range

    assert split_range(begin, end, cap) == expected


def test_large_partitions_are_read_by_several_tasks(kafka) -> None:  # type: ignore[no-untyped-def]
    create_topics(kafka.bootstrap, ["src.split"], 2)
    produce(kafka, "src.split", {0: 250, 1: 40})
    r = reader(kafka, "src.split", split_rows="100")
    try:
        start = r.initialOffset()
        parts = r.partitions(start, r.latestOffset(start, ReadAllAvailable()))
        assert [(p.partition, p.start, p.end) for p in parts] == [(0, 166, 250), (0, 0, 83), (0, 83, 166), (1, 0, 40)]
    finally:
        r.stop()


def test_small_ranges_share_a_task() -> None:
    from streaming.kafka_source import RangeGroup, TopicPartitionRange, pack_ranges

    def r(p: int, n: int) -> TopicPartitionRange:
        return TopicPartitionRange("t", p, "send_result", 0, n)

    def shape(parts: list) -> list:
        return [[x.partition for x in p.ranges] if isinstance(p, RangeGroup) else p.partition for p in parts]

    assert shape(pack_ranges([r(0, 30), r(1, 30), r(2, 30), r(3, 30)], 100)) == [[0, 1, 2], 3]
    assert shape(pack_ranges([r(0, 30), r(1, 200), r(2, 30)], 100)) == [0, 1, 2]
    assert shape(pack_ranges([r(0, 30), r(1, 30)], 0)) == [0, 1]  # 0: never packed
    assert shape(pack_ranges([], 100)) == []
    # fewer tasks than cores: the ranges are dealt to as many tasks as cores, about evenly
    assert shape(pack_ranges([r(0, 30), r(1, 30), r(2, 30), r(3, 5)], 1000, min_tasks=2)) == [[0, 2], [1, 3]]
    assert shape(pack_ranges([r(0, 5), r(1, 40), r(2, 30)], 1000, min_tasks=2)) == [1, [0, 2]]
    assert shape(pack_ranges([r(0, 30)], 1000, min_tasks=4)) == [0]
    assert shape(pack_ranges([r(0, 30), r(1, 30), r(2, 30), r(3, 30)], 100, min_tasks=2)) == [[0, 1, 2], 3]


def test_write_mode_writes_its_files_once_and_feeds_only_the_named_tables(kafka, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The combined query's readers write bronze Parquet themselves. A task lists its files in one
    ``WRITTEN`` row; a replay of the same offset range (a retried task or batch) finds the same
    names and keeps the files as they are, so nothing is written twice or half; the send results
    are also yielded as chunks for the fault step (only the feed columns, the named ones
    dictionary-encoded), and nothing else is."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from kafka import KafkaProducer

    from streaming.delta_sink import WRITTEN, ensure_tables
    from tests.integration.bronze_data import malformed, send_result

    create_topics(kafka.bootstrap, ["src.write"], 1)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=20)
    for i in range(300):
        value = malformed(i)[0] if i % 50 == 7 else send_result(i).to_json()
        producer.send("src.write", value=value, partition=0)
    producer.flush()
    producer.close()
    root = tmp_path / "tables"
    ensure_tables(str(root), ["send_results", "quarantine"])
    r = reader(kafka, "src.write", write_root=str(root), write_tag="t1", feed_tables='["send_results"]',
               feed_columns='["event_id", "broker_name"]', feed_dictionary='["broker_name"]')
    part = TopicPartitionRange("src.write", 0, "send_result", 0, 300)
    try:
        first = list(r.read(part))
        before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*.parquet")}
        second = list(r.read(part))
    finally:
        r.stop()
        while _CONSUMERS:  # read() keeps its consumer for the next task, as a Python worker would
            _CONSUMERS.popitem()[1].close()
    listing = [b for b in first if b.column("_table").to_pylist() == [WRITTEN]]
    assert len(listing) == 1 and listing[0].column("rows").to_pylist() == [300]
    files = json.loads(listing[0].column("arrow")[0].as_py())
    assert {f["table"] for f in files} == {"send_results", "quarantine"}
    assert sum(f["num_records"] for f in files) == 300
    assert all(f["path"].split("/")[-1].startswith("part-t1-src.write-0-0-300-") for f in files)
    by_table = {name: sum(f["num_records"] for f in files if f["table"] == name) for name in ("send_results", "quarantine")}
    assert by_table == {"send_results": 294, "quarantine": 6}
    for f in files:
        on_disk = pq.read_table(root / f["table"] / f["path"])
        assert on_disk.num_rows == f["num_records"] and (root / f["table"] / f["path"]).stat().st_size == f["size"]
    fed = [b for b in first if b.column("_table").to_pylist() != [WRITTEN]]
    assert {name for b in fed for name in b.column("_table").to_pylist()} == {"send_results"}
    fed_events = [pa.ipc.open_stream(p.as_py()).read_all() for b in fed for p in b.column("arrow")]
    assert sum(t.num_rows for t in fed_events) == 294
    assert {tuple(t.schema.names) for t in fed_events} == {("event_id", "broker_name")}
    assert all(pa.types.is_dictionary(t.schema.field("broker_name").type) for t in fed_events)
    assert all(pa.types.is_string(t.schema.field("event_id").type) for t in fed_events)
    # the replay: same listing, same files untouched, no temporary file left behind
    assert [b.to_pylist() for b in second if b.column("_table").to_pylist() == [WRITTEN]] == [listing[0].to_pylist()]
    # the same files with the same bytes; a kept file's mtime is refreshed (never older), so that a
    # vacuum running beside the job cannot take it for an old orphan before the batch commits it
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*.parquet")}
    assert {p: b for p, (b, _) in after.items()} == {p: b for p, (b, _) in before.items()}
    assert all(after[p][1] >= before[p][1] for p in before)
    assert not [p for p in root.rglob("*") if p.name.endswith(".tmp")]


def test_fetch_uses_the_fast_record_unpacking_and_reads_what_kafka_python_reads(kafka) -> None:  # type: ignore[no-untyped-def]
    """_fetch_range's consumer unpacks batches into columns (streaming.kafka_records); over the real broker it
    yields exactly the records a stock kafka-python consumer yields (keys, values, headers, times), also
    for ranges that end inside the log (their unpacking stops at the range's end) read one after another."""
    from kafka import KafkaConsumer, TopicPartition

    from streaming.kafka_records import ColumnarPartitionRecords, RecordColumns
    from streaming.kafka_source import _fetch_range

    create_topics(kafka.bootstrap, ["src.fast"], 1)
    for compression in (None, "gzip", "zstd"):  # zstd: what faultwatch simulate writes
        producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=20, compression_type=compression)
        for i in range(400):
            producer.send(
                "src.fast", partition=0, key=None if i % 3 == 0 else f"k{i}".encode(),
                value=None if i % 21 == 1 else json.dumps({"i": i, "pad": "x" * (i % 300)}).encode(),
                headers=[("h", str(i).encode())] if i % 5 == 0 else None, timestamp_ms=1_767_225_600_000 + i,
            )
        producer.flush()
        producer.close()
    stock = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=None, enable_auto_commit=False)
    tp = TopicPartition("src.fast", 0)
    stock.assign([tp])
    stock.seek(tp, 0)
    expected = []
    while len(expected) < 1200:
        expected.extend(stock.poll(timeout_ms=1000).get(tp, []))
    stock.close()

    r = reader(kafka, "src.fast")
    got = RecordColumns.joined(list(_fetch_range(r.options, TopicPartitionRange("src.fast", 0, "send_result", 0, 1200))))
    consumer = _CONSUMERS[consumer_key(r.options, "src.fast")]
    try:
        assert issubclass(consumer._fetcher.PartitionRecords, ColumnarPartitionRecords)
        assert list(zip(got.offsets, got.timestamps, got.keys, got.values)) == [
            (rec.offset, rec.timestamp, rec.key, rec.value) for rec in expected]
        assert [[] if h is None else h[0] for h in got.headers] == [rec.headers for rec in expected]
        assert got.offsets == list(range(1200))
        for start, end in [(0, 1), (1, 137), (137, 401), (401, 799), (5, 650), (799, 800), (790, 1011), (1199, 1200)]:
            part = RecordColumns.joined(list(_fetch_range(r.options, TopicPartitionRange(
                "src.fast", 0, "send_result", start, end))))
            assert list(zip(part.offsets, part.values)) == [(rec.offset, rec.value) for rec in expected[start:end]]
    finally:
        _CONSUMERS.pop(consumer_key(r.options, "src.fast")).close()


def test_settle_point_look_ups_find_event_times_inside_batches_again_and_again(kafka) -> None:  # type: ignore[no-untyped-def]
    """``_event_times`` (the settle point's look-ups) on batched records: the record at an offset
    (exact), or the first with a readable time at or after it; asked again, it answers again (an
    answered partition's fetched rest is dropped, not read, and must not stop later look-ups)."""
    create_topics(kafka.bootstrap, ["src.times"], 2)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=50, batch_size=1 << 20)
    t0 = 1_767_225_600_000
    for partition in (0, 1):
        for i in range(3000):  # records 0-99 of partition 1 carry no event time
            value = b"{}" if partition == 1 and i < 100 else json.dumps({"ts_ms": t0 + 10 * i + partition}).encode()
            producer.send("src.times", value=value, partition=partition)
    producer.flush()
    producer.close()
    r = reader(kafka, "src.times")
    try:
        r.prepareForTriggerAvailableNow()  # learns the ends, as a --once run does
        for round_ in range(3):
            at = 1000 * round_
            found = r._event_times([("src.times/0", at + 500, True), ("src.times/1", at + 50, False)])
            first_timed = max(at + 50, 100)
            assert found == {("src.times/0", at + 500): t0 + 10 * (at + 500),
                             ("src.times/1", at + 50): t0 + 10 * first_timed + 1}
        assert r._event_times([("src.times/0", 2999, True)]) == {("src.times/0", 2999): t0 + 29_990}
    finally:
        r.stop()


def test_a_look_up_that_gets_no_record_says_so(kafka, caplog) -> None:  # type: ignore[no-untyped-def]
    """A partition the event-time look-up gets nothing from before its deadline holds the settle point
    back: a warning names it (a broker answering fetches slowly once stalled event time silently)."""
    create_topics(kafka.bootstrap, ["src.slow"], 1)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    for i in range(10):
        producer.send("src.slow", value=json.dumps({"ts_ms": 1_767_225_600_000 + i}).encode(), partition=0)
    producer.flush()
    producer.close()
    r = reader(kafka, "src.slow")
    try:
        r.prepareForTriggerAvailableNow()
        r.options["connect_timeout_s"] = "0"  # the deadline has passed before the first fetch
        with caplog.at_level("WARNING", logger="streaming.kafka_source"):
            assert r._event_times([("src.slow/0", 5, True)]) == {}
        assert "event-time look-up got no record from src.slow/0" in caplog.text
    finally:
        r.stop()


def test_a_worker_keeps_one_consumer_per_topic(kafka) -> None:  # type: ignore[no-untyped-def]
    """Reader tasks of one worker process move between topics; each topic keeps its own consumer, so
    a task never waits for the leaders of a topic its consumer was not assigned before."""
    from streaming.kafka_records import RecordColumns
    from streaming.kafka_source import _fetch_range

    create_topics(kafka.bootstrap, ["src.one", "src.two"], 1)
    produce(kafka, "src.one", {0: 40})
    produce(kafka, "src.two", {0: 30})
    r = reader(kafka, "src.one")

    def offsets(topic: str, start: int, end: int) -> list[int]:
        part = TopicPartitionRange(topic, 0, "send_result", start, end)
        return RecordColumns.joined(list(_fetch_range(r.options, part))).offsets

    try:
        assert offsets("src.one", 0, 25) == list(range(25))
        first = _CONSUMERS[consumer_key(r.options, "src.one")]
        assert offsets("src.two", 5, 30) == list(range(5, 30))
        assert offsets("src.one", 25, 40) == list(range(25, 40))
        keys = {key for key in _CONSUMERS if key[0] == r.options[SECRET_OPTION]}
        assert keys == {consumer_key(r.options, "src.one"), consumer_key(r.options, "src.two")}
        assert _CONSUMERS[consumer_key(r.options, "src.one")] is first  # reused, not made again
        assert {tp.topic for tp in first.assignment()} == {"src.one"}
    finally:
        for key in [k for k in _CONSUMERS if k[0] == r.options[SECRET_OPTION]]:
            _CONSUMERS.pop(key).close()
