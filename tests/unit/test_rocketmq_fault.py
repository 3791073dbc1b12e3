"""Latency fault tolerance rules (RocketMQ's ``MQFaultStrategy``), one table per rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.rocketmq import (
    GENERATIONS,
    FaultItem,
    FaultState,
    Generation,
    apply_update,
    classify_error,
    duration_for,
    generation_for_client_version,
    get_generation,
    is_available,
    is_reachable,
    pick_candidates,
    rank_49,
    rank_has_ties,
    update_args,
)
from pipeline.rocketmq.outcomes import ErrorKind

G49, G5 = GENERATIONS["4.9"], GENERATIONS["5"]


@pytest.mark.parametrize(
    ("gen", "latency", "isolation", "expected"),
    [
        (G49, -1, False, 0),
        (G49, 0, False, 0),
        (G49, 549, False, 0),
        (G49, 550, False, 30000),
        (G49, 999, False, 30000),
        (G49, 1000, False, 60000),
        (G49, 2000, False, 120000),
        (G49, 3000, False, 180000),
        (G49, 15000, False, 600000),
        (G49, 10, True, 600000),
        (G5, 549, False, 0),
        (G5, 550, False, 2000),
        (G5, 1799, False, 2000),
        (G5, 1800, False, 5000),
        (G5, 3000, False, 6000),
        (G5, 5000, False, 10000),
        (G5, 15000, False, 30000),
        (G5, 10, True, 10000),
        (G5, 99999, True, 10000),
    ],
)
def test_duration_lookup(gen: Generation, latency: int, isolation: bool, expected: int) -> None:
    assert duration_for(gen, latency, isolation) == expected


def test_custom_unsorted_table_scans_from_the_end() -> None:
    """setLatencyMax([3000, 100, 550, 50]): the last entry <= latency wins, sorted or not."""
    gen = get_generation("4.9", [3000, 100, 550, 50], [7000, 0, 3000, 1])
    assert [duration_for(gen, lat, False) for lat in (10, 50, 600, 5000)] == [0, 1, 1, 1]
    assert duration_for(gen, 0, True) == 1  # isolation is looked up as latency 30000


@pytest.mark.parametrize(
    ("version", "generation"),
    [
        ("4.0.0", "4.9"),
        ("4.9.8", "4.9"),
        ("5.0.0", "4.9"),
        ("5.1.3", "4.9"),
        ("5.1.4", "5"),
        ("5.2.0", "5"),
        ("5.3.3", "5"),
        ("V5_3_3", "5"),
        ("4.9.8-SNAPSHOT", "4.9"),
        ("5.2", "5"),
        ("6.0.0", "5"),
    ],
)
def test_generation_for_client_version(version: str, generation: str) -> None:
    assert generation_for_client_version(version) == generation


@pytest.mark.parametrize("version", ["", "latest", "5", "3.2.6", "five.two"])
def test_unparseable_version_is_refused(version: str) -> None:
    with pytest.raises(ValueError, match="version"):
        generation_for_client_version(version)


def test_unknown_generation_lists_valid_names() -> None:
    with pytest.raises(ValueError, match=r"\['4.9', '5'\]"):
        get_generation("4.8")
    with pytest.raises(ValueError, match="same length"):
        get_generation("5", [1, 2], [3])


# (status, error, version, detector) -> (isolation, reachable)
UPDATE_ARGS = [
    ("SEND_OK", None, "4.9.8", False, (False, True)),
    ("FLUSH_DISK_TIMEOUT", None, "5.3.3", False, (False, True)),
    ("SLAVE_NOT_AVAILABLE", None, "5.3.3", True, (False, True)),
    (
        "FAILED",
        "org.apache.rocketmq.remoting.exception.RemotingTimeoutException",
        "4.9.8",
        False,
        (True, True),
    ),
    ("FAILED", "RemotingConnectException", "5.3.3", False, (True, True)),
    ("FAILED", "RemotingTooMuchRequestException", "5.3.3", True, (True, False)),
    ("FAILED", "MQClientException", "4.9.8", False, (True, True)),
    (
        "FAILED",
        "org.apache.rocketmq.client.exception.MQClientException: No route info",
        "5.3.3",
        False,
        (False, True),
    ),
    ("FAILED", "MQBrokerException", "4.9.8", False, (True, True)),
    ("FAILED", "[TIMEOUT_CLEAN_QUEUE]broker busy", "5.3.3", False, (True, False)),
    ("FAILED", "CODE: 2  DESC: [PCBUSY_CLEAN_QUEUE]broker busy", "5.2.0", True, (True, False)),
    ("FAILED", "InterruptedException", "4.9.8", False, (False, True)),
    ("FAILED", "java.lang.InterruptedException", "5.3.3", False, (False, True)),
    ("FAILED", "java.lang.IllegalStateException", "4.9.8", False, (False, True)),
    ("FAILED", None, "5.3.3", False, (False, True)),
]


@pytest.mark.parametrize(("status", "error", "version", "detector", "expected"), UPDATE_ARGS)
def test_update_args(status: str, error: str | None, version: str, detector: bool, expected: tuple) -> None:
    assert update_args(status, error, version, detector) == expected


def test_update_args_explicit_values_win_and_bad_status_fails() -> None:
    assert update_args("FAILED", "MQBrokerException", "5.3.3", isolation=False, reachable=True) == (
        False,
        True,
    )
    assert update_args("SEND_OK", None, "5.3.3", reachable=False) == (False, False)
    with pytest.raises(ValueError, match="send status"):
        update_args("OK", None, "5.3.3")
    with pytest.raises(ValueError, match="version"):
        update_args("SEND_OK", None, "x")


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("RemotingSendRequestException", ErrorKind.REMOTING),
        ("[REJECTREQUEST]system busy", ErrorKind.BROKER),
        ("MQBrokerException: CODE: 17 DESC: topic not exist", ErrorKind.BROKER),
        ("boom", ErrorKind.UNKNOWN),
        ("", ErrorKind.UNKNOWN),
    ],
)
def test_classify_error(error: str, kind: ErrorKind) -> None:
    assert classify_error(error) == kind


def _run(gen: Generation, events: list[tuple[int, str, int, bool, bool]]) -> FaultState:
    state = FaultState()
    for ts, broker, latency, isolation, reachable in events:
        state, _ = apply_update(gen, state, broker, latency, isolation, reachable, ts)
    return state


# events -> the single broker's item afterwards
UPDATE_RULE = [
    ("4.9 new item, duration 0: start = now", G49, [(100, "a", 10, False, True)], FaultItem("a", 10, 100)),
    ("5 new item, duration 0: start stays 0", G5, [(100, "a", 10, False, True)], FaultItem("a", 10, 0)),
    (
        "4.9 fast success ends an avoidance",
        G49,
        [(0, "a", 600, False, True), (5, "a", 10, False, True)],
        FaultItem("a", 10, 5),
    ),
    (
        "5 fast success does not",
        G5,
        [(0, "a", 600, False, True), (5, "a", 10, False, True)],
        FaultItem("a", 10, 2000),
    ),
    (
        "5 a shorter window does not shrink it",
        G5,
        [(0, "a", 15000, False, True), (5, "a", 600, False, True)],
        FaultItem("a", 600, 30000),
    ),
    ("isolation keeps the real latency", G49, [(0, "a", 7, True, True)], FaultItem("a", 7, 600000)),
    ("5 stores reachable", G5, [(0, "a", 7, True, False)], FaultItem("a", 7, 10000, reachable=False)),
    ("4.9 has no reachable flag", G49, [(0, "a", 7, True, False)], FaultItem("a", 7, 600000)),
]


@pytest.mark.parametrize(
    ("gen", "events", "item"), [r[1:] for r in UPDATE_RULE], ids=[r[0] for r in UPDATE_RULE]
)
def test_update_rule(gen: Generation, events: list, item: FaultItem) -> None:
    assert _run(gen, events).get(item.broker) == item


def test_availability_boundaries_and_unknown_brokers() -> None:
    for gen in (G49, G5):
        state = _run(gen, [(1000, "a", 600, False, True)])
        end = 1000 + duration_for(gen, 600, False)
        assert [is_available(gen, state, "a", t) for t in (1000, end - 1, end)] == [False, False, True]
        assert is_available(gen, state, "never-seen", 0)
    assert is_reachable(FaultState(), "x")
    assert not is_reachable(_run(G5, [(0, "a", 1, True, False)]), "a")


def test_rank_pick_and_ties() -> None:
    state = _run(
        G49,
        [
            (0, "a", 700, False, True),
            (0, "b", 600, False, True),
            (0, "c", 10, False, True),
            (0, "d", 20, False, True),
        ],
    )
    assert rank_49(state, 0) == ["c", "d", "b", "a"]  # available first, then latency
    assert pick_candidates(G49, state, 0) == ["c", "d"]
    assert not rank_has_ties(state, 0)
    assert pick_candidates(G49, _run(G49, [(0, "z", 1, False, True)]), 0) == ["z"]
    assert pick_candidates(G49, FaultState(), 0) == []
    tied = _run(G49, [(0, "a", 700, False, True), (0, "b", 700, False, True)])
    assert rank_has_ties(tied, 0) and rank_49(tied, 0) == ["a", "b"]
    five = _run(G5, [(0, "b", 1, False, True), (0, "a", 1, True, False), (0, "c", 1, False, True)])
    assert pick_candidates(G5, five, 0) == ["b", "c"]


@given(
    gen=st.sampled_from([G49, G5]),
    a=st.integers(-(10**6), 10**7),
    b=st.integers(-(10**6), 10**7),
)
def test_duration_is_monotone_in_latency(gen: Generation, a: int, b: int) -> None:
    low, high = sorted((a, b))
    assert duration_for(gen, low, False) <= duration_for(gen, high, False)


@given(
    steps=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=8),
    a=st.integers(-10, 2 * 10**6),
    b=st.integers(-10, 2 * 10**6),
)
def test_duration_is_monotone_for_any_ascending_table(steps: list[tuple[int, int]], a: int, b: int) -> None:
    latency_max = sorted(s[0] for s in steps)
    durations = sorted(s[1] for s in steps)
    gen = get_generation("5", latency_max, durations)
    low, high = sorted((a, b))
    assert duration_for(gen, low, False) <= duration_for(gen, high, False)
