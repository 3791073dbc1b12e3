from __future__ import annotations

import dataclasses

import orjson
import pytest

from schemas.events import (
    ConsumerProgress,
    GroupMembership,
    Invalid,
    SendResult,
    decode_event,
)
from schemas.fields import Field, arrow_schema
from schemas.tables import all_tables, routed_fields

GOOD = SendResult(
    event_id="p1-1", ts_ms=1_700_000_000_000, cluster="c1", producer_group="PG", client_id="10.0.0.1@1",
    client_version="4.9.8", topic="T", broker_name="broker-a", queue_id=3, status="SEND_OK", latency_ms=12,
    error=None, queue_offset=41, attempt=0,
)


def good_obj() -> dict:
    return orjson.loads(GOOD.to_json())


def test_dataclass_round_trips_through_the_contract() -> None:
    row = decode_event("send_result", GOOD.to_json())
    assert row == {**good_obj(), "isolation": None, "reachable": None, "send_latency_fault_enable": None,
                   "fault_item_removed": None, "fault_item_removed_ms": None}  # the last two: absent from the JSON
    removal = dataclasses.replace(GOOD, fault_item_removed="broker-b", fault_item_removed_ms=GOOD.ts_ms - 3)
    assert decode_event("send_result", removal.to_json())["fault_item_removed"] == "broker-b"
    assert decode_event("send_result", removal.to_json())["fault_item_removed_ms"] == GOOD.ts_ms - 3
    progress = ConsumerProgress(1_700_000_000_000, "c1", "G", "T", "broker-a", 0, 10, 12, "cid", None)
    assert decode_event("consumer_progress", progress.to_json())["consumer_offset"] == 10
    member = GroupMembership(1_700_000_000_000, "c1", "G", "T", ("a", "b"), "AVG")
    assert decode_event("group_membership", member.to_json())["client_ids"] == ["a", "b"]


def mutate(**changes: object) -> bytes:
    obj = good_obj()
    for k, v in changes.items():
        if v is KeyError:
            del obj[k]
        else:
            obj[k] = v
    return orjson.dumps(obj)


@pytest.mark.parametrize(
    "value, reason",
    [
        (b"{not json", "bad_json"),
        (b"\xff\xfe\x00garbage", "not_utf8"),
        (b'{"event_id": "\xff"}', "not_utf8"),
        (b"", "empty"),
        (b"[1, 2]", "not_an_object"),
        (b"x" * 70_000, "oversize"),
        (mutate(latency_ms=KeyError), "missing_field"),
        (mutate(cluster=None), "null_field"),
        (mutate(latency_ms="12"), "wrong_type"),
        (mutate(latency_ms=True), "wrong_type"),
        (mutate(queue_id=1.5), "wrong_type"),
        (mutate(latency_ms=-1), "out_of_range"),
        (mutate(queue_id=-2), "out_of_range"),
        (mutate(ts_ms=5), "out_of_range"),
        (mutate(status="SENT"), "unknown_value"),
        (mutate(schema_version=2), "out_of_range"),
        (mutate(cluster=""), "empty_string"),
        (mutate(isolation="yes"), "wrong_type"),
    ],
)
def test_invalid_send_results_have_a_stable_reason(value: bytes, reason: str) -> None:
    with pytest.raises(Invalid) as err:
        decode_event("send_result", value)
    assert err.value.reason == reason
    assert err.value.detail


def test_unknown_fields_are_ignored_and_optional_fields_may_be_null() -> None:
    row = decode_event("send_result", mutate(extra_field=1, error=None, queue_offset=None, isolation=True))
    assert row["isolation"] is True and "extra_field" not in row


def test_arrow_and_spark_schemas_agree(spark) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql.pandas.types import to_arrow_schema

    for spec in all_tables().values():
        assert spec.spark_schema().names == spec.columns
        back = to_arrow_schema(spec.spark_schema())
        assert [f.type for f in back] == [f.type for f in spec.arrow_schema()], spec.name


def test_routed_fields_reject_conflicting_types() -> None:
    fields = routed_fields(["send_results", "quarantine"])
    assert fields[0].name == "_table" and all(f.nullable for f in fields[1:])
    with pytest.raises(ValueError, match="unknown kind"):
        Field("x", "decimal")
    assert arrow_schema(fields).names[0] == "_table"


def test_integers_beyond_arrow_range_are_rejected() -> None:
    from schemas.events import SEND_RESULT
    from schemas.fields import check_record

    huge = mutate(queue_offset=2**63 - 1).replace(b"9223372036854775807", b"92233720368547758070")
    with pytest.raises(Invalid) as err:
        decode_event("send_result", huge)  # orjson reads it as a float
    assert err.value.reason == "wrong_type"
    with pytest.raises(Invalid) as err:
        check_record(SEND_RESULT, {**good_obj(), "queue_offset": 2**64})
    assert err.value.reason == "out_of_range"


def test_decoder_quarantines_what_check_record_rejects() -> None:
    from collections import namedtuple

    from streaming.decode import BatchDecoder
    from streaming.kafka_records import RecordColumns
    from streaming.kafka_source import output_tables

    rec = namedtuple("rec", "key value offset timestamp")
    values = [GOOD.to_json(), mutate(queue_id=2**40), mutate(latency_ms=-1), b"{", mutate(status="X")]
    batch = BatchDecoder("send_result", output_tables(["send_result"]), 65_536).decode(
        "t", 0, RecordColumns.of(rec(None, v, i, 1) for i, v in enumerate(values))
    )
    rows = batch.to_pylist()
    assert [r["_table"] for r in rows].count("send_results") == 1
    assert sorted(r["reason"] for r in rows if r["_table"] == "quarantine") == [
        "bad_json", "out_of_range", "out_of_range", "unknown_value"
    ]
    good = next(r for r in rows if r["_table"] == "send_results")
    assert good["event_id"] == GOOD.event_id and good["event_date"] == "2023-11-14" and good["kafka_offset"] == 0


def test_decoding_leaves_the_garbage_collector_as_it_found_it() -> None:
    import gc
    from collections import namedtuple

    from streaming.decode import BatchDecoder
    from streaming.kafka_records import RecordColumns
    from streaming.kafka_source import output_tables

    rec = namedtuple("rec", "key value offset timestamp")
    decoder = BatchDecoder("send_result", output_tables(["send_result"]), 65_536)
    records = RecordColumns.of([rec(None, GOOD.to_json(), 0, 1)])
    assert gc.isenabled()
    decoder.decode("t", 0, records)
    assert gc.isenabled()
    gc.disable()
    try:
        decoder.decode("t", 0, records)
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(AttributeError):
        decoder.decode("t", 0, None)  # type: ignore[arg-type]
    assert gc.isenabled()


def test_by_table_cuts_a_routed_batch_into_each_tables_rows() -> None:
    from collections import namedtuple

    import pyarrow.compute as pc

    from schemas.tables import table
    from streaming.decode import BatchDecoder
    from streaming.kafka_records import RecordColumns
    from streaming.kafka_source import by_table, output_tables

    rec = namedtuple("rec", "key value offset timestamp")
    decoder = BatchDecoder("send_result", output_tables(["send_result"]), 65_536)
    for values in ([GOOD.to_json(), b"{", mutate(attempt=2)], [GOOD.to_json(), mutate(attempt=2)]):
        batch = decoder.decode("t", 0, RecordColumns.of(rec(None, v, i, 1) for i, v in enumerate(values)))
        parts = by_table(batch)
        assert sorted(parts) == sorted(set(batch.column("_table").to_pylist()))
        for name, rows in parts.items():
            expected = batch.filter(pc.equal(batch.column("_table"), name)).select(table(name).columns)
            assert rows.schema == table(name).arrow_schema() and rows.to_pylist() == expected.to_pylist()


def test_decoder_quarantines_an_event_stamped_far_ahead_of_its_kafka_record() -> None:
    """A producer clock in the year 2100 is caught at the door, with its own reason, and nothing else is."""
    from collections import namedtuple

    from streaming.decode import FUTURE, BatchDecoder
    from streaming.kafka_records import RecordColumns
    from streaming.kafka_source import output_tables

    rec = namedtuple("rec", "key value offset timestamp")
    kafka_ts = GOOD.ts_ms
    values = [GOOD.to_json(), mutate(ts_ms=4_102_444_000_000), mutate(ts_ms=kafka_ts + 299_000),
              mutate(ts_ms=kafka_ts + 301_000), mutate(ts_ms=kafka_ts + 10**9)]
    stamps = [kafka_ts, kafka_ts, kafka_ts, kafka_ts, -1]  # -1: a record without a timestamp is not judged
    decoder = BatchDecoder("send_result", output_tables(["send_result"]), 65_536, max_future_skew_ms=300_000)
    rows = decoder.decode("t", 0, RecordColumns.of(rec(None, v, i, t) for i, (v, t) in enumerate(zip(values, stamps)))).to_pylist()
    kept = sorted(r["kafka_offset"] for r in rows if r["_table"] == "send_results")
    quarantined = sorted((r["source_offset"], r["reason"]) for r in rows if r["_table"] == "quarantine")
    assert kept == [0, 2, 4]
    assert quarantined == [(1, FUTURE), (3, FUTURE)]
    detail = next(r["detail"] for r in rows if r["_table"] == "quarantine")
    assert "stream.max_future_skew_s" in detail and str(kafka_ts) in detail
    unjudged = BatchDecoder("send_result", output_tables(["send_result"]), 65_536).decode(
        "t", 0, RecordColumns.of(rec(None, v, i, t) for i, (v, t) in enumerate(zip(values, stamps))))
    assert unjudged.num_rows == 5 and set(unjudged.column("_table").to_pylist()) == {"send_results"}


def test_every_dated_table_says_which_column_its_date_and_retention_go_by() -> None:
    """maintenance.data_retention_h deletes by a table's time column; a table partitioned by
    event_date must name the epoch-ms column the date is of, and a bad name fails at declaration."""
    from schemas.fields import Field, TableSpec
    from schemas.tables import all_tables

    for spec in all_tables().values():
        if "event_date" in spec.partition_by:
            assert spec.time_column is not None, spec.name
        if spec.time_column is not None:
            assert next(f.kind for f in spec.fields if f.name == spec.time_column) == "int64", spec.name
    with pytest.raises(ValueError, match="time_column 'ts' is not one of its columns"):
        TableSpec("t", (Field("ts_ms", "int64"),), time_column="ts")
