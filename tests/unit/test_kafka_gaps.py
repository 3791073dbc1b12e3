"""Which unread offsets are gone, per partition (streaming/kafka_gaps.py)."""

from __future__ import annotations

import pytest

from streaming.kafka_gaps import DELETED, RESET, Gap, fatal_message, find_gaps, gap_entries, gaps_in

NOW = 1_700_000_000_000


@pytest.mark.parametrize(
    ("position", "begin", "end", "expected"),
    [
        (300, 0, 600, None),  # inside: nothing lost
        (300, 300, 600, None),  # exactly at the oldest offset left
        (600, 0, 600, None),  # caught up
        (300, 450, 600, Gap("t/0", 300, 449, 450, DELETED, NOW)),  # retention passed the job
        (900, 0, 120, Gap("t/0", 120, 899, 0, RESET, NOW)),  # topic re-created: the partition ends earlier
        (900, 40, 40, Gap("t/0", 40, 899, 40, RESET, NOW)),  # a broker came back empty, some offsets deleted
    ],
)
def test_find_gaps_per_case(position: int, begin: int, end: int, expected: Gap | None) -> None:
    assert find_gaps({"t/0": position}, {"t/0": begin}, {"t/0": end}, NOW) == ([expected] if expected else [])


def test_a_partition_kafka_no_longer_lists_is_no_gap() -> None:
    assert find_gaps({"t/0": 5, "t/1": 5}, {"t/0": 0}, {"t/0": 9}, NOW) == []


def test_gaps_round_trip_through_offset_entries_and_are_named_in_the_message() -> None:
    gaps = [Gap("a.b/3", 10, 19, 20, DELETED, NOW), Gap("a.b/4", 7, 99, 0, RESET, NOW)]
    assert gaps_in({"a.b/3": 25, "_settle_ms": 1, **gap_entries(gaps)}) == {g.key: g for g in gaps}
    message = fatal_message(gaps)
    assert "a.b/3 offsets 10-19 deleted by retention" in message
    assert "a.b/4 offsets 7-99 gone" in message and "kafka.fail_on_data_loss = false" in message
