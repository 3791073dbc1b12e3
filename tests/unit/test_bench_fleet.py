"""bench/stream.py --fleet builds the fleet it claims: brokers, producers and pairs times the factor,
the same events per second (each producer slower, each group's progress reports sparser)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from bench.fleet import (
    alternated,
    fleet_shape,
    pairs,
    parse_factors,
    producer_count,
    progress_rate,
    send_rate,
)
from bench.stream import fleet_topics, instance_scenario, write_config
from pipeline.config import load_config
from pipeline.simulate import MemorySink, Simulation


@pytest.mark.parametrize(("factor", "shape"), [(1, (1, 1)), (2, (1, 2)), (4, (2, 2)), (10, (2, 5)),
                                               (12, (3, 4)), (100, (10, 10))])
def test_shape_multiplies_brokers_and_producers_to_the_factor(factor: int, shape: tuple[int, int]) -> None:
    assert fleet_shape(factor) == shape


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "10"])
def test_a_bad_factor_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="fleet factor"):
        fleet_shape(bad)  # type: ignore[arg-type]


# The bench's clusters: 13 brokers, 40 producers in three groups of 20, 10 and 10, 40 sends/s each.
@pytest.mark.parametrize(("factor", "brokers", "producers", "rate"),
                         [(1, 13, (20, 10, 10), 40.0), (10, 26, (100, 50, 50), 8.0), (100, 130, (200, 100, 100), 4.0)])
def test_the_scaled_cluster(factor: int, brokers: int, producers: tuple[int, ...], rate: float) -> None:
    one, s = instance_scenario(2, 300.0), instance_scenario(2, 300.0, factor)
    assert len(s.brokers) == brokers and len({b.name for b in s.brokers}) == brokers
    assert {b.cluster for b in s.brokers} == {"bench-2"}
    assert [dataclasses.replace(b, name="") for b in s.brokers] == [dataclasses.replace(one.brokers[0], name="")] * brokers
    assert [(p.group, p.count, p.rate_per_s) for p in s.producers] == [
        (p.group, n, rate) for p, n in zip(one.producers, producers)]
    assert producer_count(s) == sum(producers)
    assert pairs(s) == 520 * factor
    # the same load: messages and progress rows per second, the same groups, faults and duration
    assert send_rate(s) == pytest.approx(send_rate(one)) == 1600.0
    assert progress_rate(s) == pytest.approx(progress_rate(one))
    assert [dataclasses.replace(c, progress_interval_s=0) for c in s.consumers] == [
        dataclasses.replace(c, progress_interval_s=0) for c in one.consumers]
    assert (s.faults, s.duration_s, s.consumer_events) == (one.faults, one.duration_s, one.consumer_events)


def test_the_simulated_fleet_sends_as_much_over_its_pairs() -> None:
    """30 s of one cluster at 1x and at 10x: the same events per kind (within 5 %), from every
    producer to every broker of the larger fleet."""
    runs = {}
    for factor in (1, 10):
        sink = MemorySink()
        Simulation(instance_scenario(0, 30.0, factor), seed=1).run(sink)
        runs[factor] = sink
    for kind in ("send_result", "consumer_progress", "group_membership"):
        one, ten = runs[1].count(kind), runs[10].count(kind)
        assert one > 0 and abs(ten - one) <= 0.05 * one, (kind, one, ten)
    sends = runs[10].events("send_result")
    assert len({e.client_id for e in sends}) == 200
    assert len({e.broker_name for e in sends}) == 26
    # at 8 messages/s over 26 brokers, each producer reaches every one of them in 30 s
    per_producer = Counter(client for client, _broker in {(e.client_id, e.broker_name) for e in sends})
    assert set(per_producer.values()) == {26}


def test_each_fleet_reads_its_own_topics(tmp_path: Path) -> None:
    assert fleet_topics(1) == {}
    conf = write_config(tmp_path / "f.toml", "127.0.0.1:9", tmp_path, topics=fleet_topics(100))
    topics = load_config(conf).topics
    assert (topics.send_results, topics.consumer_progress, topics.group_membership) == (
        "fleet100.rmq.send-results", "fleet100.rmq.consumer-progress", "fleet100.rmq.group-membership")


def test_factors_and_their_alternated_order() -> None:
    assert parse_factors("1,10,100") == [1, 10, 100]
    assert alternated([1, 10, 100], 3) == [1, 10, 100, 100, 10, 1, 1, 10, 100]
    for bad in ("1,x", "10", "1,1", "1,0"):
        with pytest.raises(ValueError):
            parse_factors(bad)
