"""Events for the bronze tests: valid events of all three kinds plus every kind of malformed record."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timezone

import orjson

from schemas.events import ConsumerProgress, GroupMembership, SendResult

BASE_TS = 1_700_000_000_000


@dataclass
class Mix:
    valid: dict[str, list[bytes]] = field(default_factory=lambda: {"send_result": [], "consumer_progress": [], "group_membership": []})
    bad: list[tuple[str, bytes, str]] = field(default_factory=list)  # (kind, value, expected reason)


def send_result(i: int) -> SendResult:
    ok = i % 10 != 0
    return SendResult(
        event_id=f"ev-{i}", ts_ms=BASE_TS + i * 7, cluster="c1", producer_group="PG", client_id=f"p{i % 13}",
        client_version="4.9.8" if i % 2 else "5.3.3", topic="T", broker_name=f"broker-{i % 5}", queue_id=i % 4,
        status="SEND_OK" if ok else "FAILED", latency_ms=(i * 37) % 700, error=None if ok else "RemotingTimeoutException",
        queue_offset=i if ok else None, attempt=0,
    )


def malformed(i: int) -> tuple[bytes, str]:
    obj = orjson.loads(send_result(i).to_json())
    choice = i % 7
    if choice == 0:
        return b'{"event_id": "broken', "bad_json"
    if choice == 1:
        del obj["latency_ms"]
        return orjson.dumps(obj), "missing_field"
    if choice == 2:
        obj["queue_id"] = "three"
        return orjson.dumps(obj), "wrong_type"
    if choice == 3:
        obj["latency_ms"] = -5
        return orjson.dumps(obj), "out_of_range"
    if choice == 4:
        obj["status"] = "MAYBE_OK"
        return orjson.dumps(obj), "unknown_value"
    if choice == 5:
        return b"\xc3\x28\xa0\xa1 not utf-8", "not_utf8"
    return orjson.dumps({**obj, "padding": "x" * 70_000}), "oversize"


def make_mix(n: int, seed: int = 7) -> Mix:
    """``n`` records, ~1% malformed, in a seeded order; 80% send results, the rest progress/membership."""
    rng = random.Random(seed)
    mix = Mix()
    for i in range(n):
        r = rng.random()
        if r < 0.01:
            value, reason = malformed(i)
            mix.bad.append(("send_result", value, reason))
        elif r < 0.81:
            mix.valid["send_result"].append(send_result(i).to_json())
        elif r < 0.97:
            ev = ConsumerProgress(BASE_TS + i, "c1", f"G{i % 3}", "T", f"broker-{i % 5}", i % 4, i, i + 5, f"c{i % 2}", BASE_TS)
            mix.valid["consumer_progress"].append(ev.to_json())
        else:
            ev2 = GroupMembership(BASE_TS + i, "c1", f"G{i % 3}", "T", (f"c{i % 2}", "c9"), "AVG")
            mix.valid["group_membership"].append(ev2.to_json())
    return mix


Position = tuple[str, int, int]  # (topic, partition, offset) of a record produced


def produce_mix(bootstrap: str, topics: dict[str, str], mix: Mix) -> dict[Position, bytes]:
    """Produce every record of ``mix``; returns each record's value by the position Kafka gave it."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=256 * 1024, max_request_size=4_000_000)
    sent = []
    for kind, values in mix.valid.items():
        for v in values:
            sent.append((producer.send(topics[kind], key=orjson.loads(v).get("broker_name", "g").encode(), value=v), v))
    for kind, value, _reason in mix.bad:
        sent.append((producer.send(topics[kind], key=b"bad", value=value), value))
    producer.flush()
    positions = {}
    for future, value in sent:
        meta = future.get(timeout=60)
        positions[(meta.topic, meta.partition, meta.offset)] = value
    producer.close()
    return positions


def assert_bronze_holds(root: str, mix: Mix, produced: dict[Position, bytes]) -> None:
    """The bronze tables hold exactly the ``produced`` records, each once at its Kafka position: a
    valid event as a row of its kind's table (every event field equal, dated by its ``ts_ms`` in
    UTC), a malformed record in quarantine (its bytes and the expected reason)."""
    from pipeline.deltaio import read_table

    reasons = {value: reason for _kind, value, reason in mix.bad}
    want: dict[Position, object] = {
        pos: ("quarantine", v, reasons[v]) if v in reasons else ("event", orjson.loads(v)) for pos, v in produced.items()
    }
    got: dict[Position, object] = {}
    twice: list[Position] = []
    for name in ("send_results", "consumer_progress", "group_membership"):
        rows = read_table(root, name).to_pylist()
        for row in rows:
            pos = (row.pop("kafka_topic"), row.pop("kafka_partition"), row.pop("kafka_offset"))
            row.pop("kafka_ts_ms")
            date = datetime.fromtimestamp(row["ts_ms"] / 1000, timezone.utc).strftime("%Y-%m-%d")
            assert row.pop("event_date") == date, (name, pos)
            twice += [pos] if pos in got else []
            got[pos] = ("event", row)
    for row in read_table(root, "quarantine").to_pylist():
        pos = (row["source_topic"], row["source_partition"], row["source_offset"])
        twice += [pos] if pos in got else []
        got[pos] = ("quarantine", row["raw_value"], row["reason"])
    assert not twice, f"{len(twice)} records written twice, e.g. {twice[:3]}"
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing and not extra, f"{len(missing)} records missing, e.g. {missing[:3]}; " \
        f"{len(extra)} rows not produced, e.g. {[(p, got[p]) for p in extra[:2]]}"
    for pos, row in got.items():  # an optional field the record left out is a null column
        w = want.get(pos)
        if row[0] == "event" and isinstance(w, tuple) and w[0] == "event":
            want[pos] = ("event", {**dict.fromkeys(set(row[1]) - set(w[1])), **w[1]})
    differ = [pos for pos in sorted(want) if got[pos] != want[pos]]
    assert not differ, f"{len(differ)} rows differ from the record produced, e.g. " \
        f"{[(got[p], want[p]) for p in differ[:2]]}"
