"""What the lag keys keep of the send results: per queue and second, the lowest and highest offset
sent (or one failed send), by one rule that gives the same rows however the sends are cut up."""

from __future__ import annotations

import random

import pyarrow as pa

from pipeline.lag.sends import per_second

COORDINATES = ("kafka_topic", "kafka_partition", "kafka_offset")
T = 1_700_000_000_000  # a whole second


def sends(rows: list[tuple[int, str, int, int | None, int]]) -> pa.Table:
    """(ts_ms, broker, queue id, queue offset, Kafka offset) -> bronze-named send rows."""
    return pa.table({
        "ts_ms": pa.array([r[0] for r in rows], pa.int64()),
        "cluster": ["c1"] * len(rows),
        "topic": ["T"] * len(rows),
        "broker_name": [r[1] for r in rows],
        "queue_id": pa.array([r[2] for r in rows], pa.int32()),
        "queue_offset": pa.array([r[3] for r in rows], pa.int64()),
        "kafka_topic": ["rmq.a" if r[4] % 2 else "rmq.b" for r in rows],  # two topics: ranked by name
        "kafka_partition": pa.array([r[4] % 3 for r in rows], pa.int32()),
        "kafka_offset": pa.array([r[4] for r in rows], pa.int64()),
    })


def kept(table: pa.Table) -> list[tuple[int, str, int, int | None, int]]:
    return sorted(zip(*(table.column(c).to_pylist() for c in ("ts_ms", "broker_name", "queue_id", "queue_offset",
                                                                "kafka_offset"))),
                  key=lambda r: (r[0], r[1], r[2], -1 if r[3] is None else r[3], r[4]))


def test_the_lowest_and_highest_offset_of_each_queue_and_second_are_kept() -> None:
    rows = [
        (T + 1, "b1", 0, 10, 0), (T + 400, "b1", 0, 11, 1), (T + 999, "b1", 0, 12, 2), (T + 1000, "b1", 0, 13, 3),
        (T + 1001, "b1", 0, 14, 4),  # the next second: (T + 1000, T + 2000]
        (T + 500, "b1", 1, 7, 5), (T + 600, "b2", 0, 7, 6),  # other queues
        (T + 700, "b1", 1, None, 7),  # a failed send beside a stored one: dropped
        (T + 2500, "b2", 1, None, 9), (T + 2200, "b2", 1, None, 8),  # failed sends only: the earliest
    ]
    assert kept(per_second(sends(rows), COORDINATES)) == [
        (T + 1, "b1", 0, 10, 0), (T + 500, "b1", 1, 7, 5), (T + 600, "b2", 0, 7, 6), (T + 1000, "b1", 0, 13, 3),
        (T + 1001, "b1", 0, 14, 4), (T + 2200, "b2", 1, None, 8)]


def test_ties_go_to_the_earliest_send_then_the_first_in_kafka() -> None:
    rows = [(T + 300, "b1", 0, 5, 8), (T + 200, "b1", 0, 5, 9), (T + 200, "b1", 0, 5, 3), (T + 900, "b1", 0, 3, 1)]
    assert kept(per_second(sends(rows), COORDINATES)) == [(T + 200, "b1", 0, 5, 3), (T + 900, "b1", 0, 3, 1)]


def test_the_rule_gives_the_same_rows_however_the_sends_are_cut() -> None:
    rng = random.Random(7)
    rows = [(T + rng.randrange(5_000), rng.choice(["b1", "b2"]), rng.randrange(3),
             rng.choice([None, *range(40)]), k) for k in range(600)]
    whole = kept(per_second(sends(rows), COORDINATES))
    for parts in (2, 5, 40):
        shuffled = rows[:]
        rng.shuffle(shuffled)
        cuts = sorted(rng.sample(range(1, len(rows)), parts - 1))
        pieces = [per_second(sends(shuffled[lo:hi]), COORDINATES)
                  for lo, hi in zip([0, *cuts], [*cuts, len(rows)])]
        assert kept(per_second(pa.concat_tables(pieces), COORDINATES)) == whole
