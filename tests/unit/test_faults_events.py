"""Per-event facts the fault step derives: order, update arguments, error classes."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.faults import from_send_results
from pipeline.faults.events import (
    error_class,
    fault_enabled,
    generation_codes,
    processing_order,
    update_arguments,
)
from pipeline.rocketmq import update_args
from tests.doubles.faults_reference import event_array
from tests.doubles.faults_synth import ERRORS, random_stream


@pytest.mark.parametrize(
    "error,expected",
    [
        ("RemotingConnectException: connect to 10.0.0.1:10911 failed", "RemotingConnectException"),
        ("org.apache.rocketmq.remoting.exception.RemotingTimeoutException: wait 3000(ms)", "RemotingTimeoutException"),
        ("MQBrokerException: CODE: 2  DESC: [TIMEOUT_CLEAN_QUEUE]broker busy, period in queue: 206ms",
         "MQBrokerException[TIMEOUT_CLEAN_QUEUE]"),
        ("[PCBUSY_CLEAN_QUEUE]broker busy, start flow control for a while", "[PCBUSY_CLEAN_QUEUE]"),
        ("MQBrokerException: CODE: 14 DESC: service not available now", "MQBrokerException(CODE 14)"),
        (None, "unknown"),
        ("   ", "unknown"),
        ("something odd happened", "something odd happened"),
    ],
)
def test_error_class(error: str | None, expected: str) -> None:
    assert error_class(error) == expected


def test_update_arguments_agree_with_the_rules_event_by_event() -> None:
    events = random_stream(2, producers=20, events=2000)
    # every error class, both statuses and every client generation are among the events compared
    assert {e.error for e in events} == {None, *ERRORS}
    assert {e.status for e in events} == {"SEND_OK", "FAILED"}
    assert {e.client_version for e in events} == {"4.9.8", "5.3.3", "5.1.4", "4.9.4"}
    cols = from_send_results(events)
    for detector in (False, True):
        gen = generation_codes(cols["client_version"])
        iso, reach = update_arguments(gen, cols["status"], cols["error"], cols["isolation"], cols["reachable"], detector)
        want = [update_args(e.status, e.error, e.client_version, detector, e.isolation, e.reachable) for e in events]
        assert list(zip(iso.tolist(), reach.tolist())) == want


def test_generation_codes_mark_unparseable_versions() -> None:
    codes = generation_codes(event_array(["4.9.8", "5.3.3", "5.1.4", "V5_2_0", "banana", None, "3.2.6"]))
    assert codes.tolist() == [0, 1, 1, 1, -1, -1, -1]


def test_fault_enable_defaults_only_where_the_event_is_silent() -> None:
    got = fault_enabled(event_array([True, False, None]), default=True)
    assert got.tolist() == [True, False, True]


def test_processing_order_is_time_then_kafka_position_then_event_id() -> None:
    cols = {
        "ts_ms": np.asarray([5, 5, 5, 4, 5]),
        "kafka_partition": np.asarray([1, 0, 0, 3, 0]),
        "kafka_offset": np.asarray([0, 9, 7, 1, 7]),
        "event_id": event_array(["a", "b", "d", "e", "c"]),
    }
    assert processing_order(cols).tolist() == [3, 4, 2, 1, 0]


def test_arrow_input_with_dictionary_encoded_strings_gives_the_same_columns() -> None:
    """The combined query's readers feed the step chunks whose low-cardinality strings are
    dictionary-encoded, each chunk with its own dictionary: the columns must come out as from
    plain strings (nulls included)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.faults.concern import event_schema
    from pipeline.faults.events import EVENT_COLUMNS, from_arrow_table
    from streaming.feeds import FAULT_DICTIONARY as FEED_DICTIONARY

    events = random_stream(5, producers=6, brokers=3, events=400, span_ms=60_000)
    cols = from_send_results(events)
    plain = pa.table({c: pa.array(list(cols[c]), event_schema().field(c).type) for c in EVENT_COLUMNS})
    assert plain.column("error").null_count > 0
    halves = [plain.slice(0, 150), plain.slice(150)]
    encoded = pa.concat_tables([
        pa.table({c: pc.dictionary_encode(h.column(c)) if c in FEED_DICTIONARY else h.column(c) for c in EVENT_COLUMNS})
        for h in halves
    ])
    assert pa.types.is_dictionary(encoded.schema.field("broker_name").type)
    want, got = from_arrow_table(plain), from_arrow_table(encoded)
    for c in EVENT_COLUMNS:
        assert list(map(repr, got[c].tolist())) == list(map(repr, want[c].tolist())), c  # repr: nan == nan


def test_events_from_dictionary_encoded_arrow_read_as_from_columns() -> None:
    """What the step reads of a batch (columns, codes, some rows, flags) is the same whether the
    batch comes as columns or as the readers' chunks, each with its own dictionaries."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.faults.concern import event_schema
    from pipeline.faults.events import EVENT_COLUMNS, Events
    from streaming.feeds import FAULT_DICTIONARY as FEED_DICTIONARY

    events = random_stream(6, producers=6, brokers=3, events=400, span_ms=60_000)
    cols = from_send_results(events)
    plain = pa.table({c: pa.array(list(cols[c]), event_schema().field(c).type) for c in EVENT_COLUMNS})
    encoded = pa.concat_tables([
        pa.table({c: pc.dictionary_encode(h.column(c)) if c in FEED_DICTIONARY else h.column(c) for c in EVENT_COLUMNS})
        for h in (plain.slice(0, 150), plain.slice(150, 0), plain.slice(150))
    ])
    rows = np.flatnonzero(np.arange(len(events)) % 3 == 1)
    for got in (Events(encoded), Events(plain)):
        want = Events(cols)
        assert got.num_rows == want.num_rows and list(got) == list(want) and "error" in got
        for c in ("broker_name", "producer_group", "client_id", "client_version", "status", "error"):
            for r in (None, rows):
                coded, expected = got.codes(c, r), want.codes(c, r)
                assert coded.values().tolist() == expected.values().tolist(), c
                assert sorted(coded.words.tolist()) == sorted(expected.words.tolist()), c  # only the values used
            assert got.at(c, rows).tolist() == cols[c][rows].tolist()
        for c in ("event_id", "ts_ms", "latency_ms"):
            assert got.at(c, rows).tolist() == cols[c][rows].tolist()
            assert got[c].tolist() == cols[c].tolist()
        for c in ("isolation", "reachable", "send_latency_fault_enable"):
            assert [a.tolist() for a in got.flags(c, rows)] == [a.tolist() for a in want.flags(c, rows)]
            assert got.flags(c, rows)[0].any() and not got.flags(c, rows)[0].all(), c


def test_events_read_from_arrow_re_encode_as_the_columns_do() -> None:
    """The fault step gets its events as an Arrow table (:class:`Events`); quarantine rows re-encode
    them row by row, so the table's column names are read once, not per row and field."""
    import pyarrow as pa

    from pipeline.faults.concern import event_schema
    from pipeline.faults.events import EVENT_COLUMNS, Events, reencode
    from schemas.events import decode_event

    cols = from_send_results(random_stream(7, events=40))
    kept = [c for c in EVENT_COLUMNS if c != "reachable"]
    events = Events(pa.table({c: pa.array(list(cols[c]), event_schema().field(c).type) for c in kept}))
    assert "broker_name" in events and "reachable" not in events and "nonsense" not in events
    assert list(events) == kept and len(events) == len(kept)
    rows = [0, 5, 39]
    assert reencode(events, rows) == reencode({c: cols[c] for c in kept}, rows)
    assert [decode_event("send_result", raw)["broker_name"] for raw in reencode(events, rows)] == [
        cols["broker_name"][i] for i in rows]
