"""When the demo's story is told: in event time, with the episode closed and its alert resolved."""

from __future__ import annotations

import pytest

from faultwatch.demo_story import AlertLog, AlertStory, settle_needed_ms, story_told
from pipeline.config import load_config
from pipeline.simulate.scenario import load_scenario

EPOCH = 1_000_000


def test_the_demo_waits_for_the_recovery_plus_the_close_rule_not_for_its_duration() -> None:
    cfg = load_config(None)
    scenario = load_scenario("demo")  # broker-b down from 20 s to 60 s
    # 60 s + 30 s (close rule) + 2 x 5 s (grid): beyond 120 s - 30 s (what the duration settles).
    assert settle_needed_ms(scenario, EPOCH, 120.0, cfg) == EPOCH + 100_000
    # A run too short to see the recovery waits for the end of its own duration only.
    assert settle_needed_ms(scenario, EPOCH, 15.0, cfg) == EPOCH - 15_000
    steady = load_scenario("steady")
    assert not steady.faults
    assert settle_needed_ms(steady, EPOCH, 120.0, cfg) == EPOCH + 90_000


@pytest.mark.parametrize(
    ("settled", "open_episodes", "resolved", "told"),
    [
        (None, 0, 200_000, False),  # no batch yet
        (EPOCH + 99_999, 0, 200_000, False),  # event time not far enough
        (EPOCH + 100_000, 1, 200_000, False),  # the episode still open
        (EPOCH + 100_000, 0, None, False),  # its alert still firing
        (EPOCH + 100_000, 0, 200_000, True),
    ],
)
def test_story_told(settled: int | None, open_episodes: int, resolved: int | None, told: bool) -> None:
    alerts = [AlertStory("broker_fault|c|b", "broker_fault", "s", 50_000, resolved)]
    assert story_told(settled, EPOCH + 100_000, open_episodes, alerts) is told


def test_the_alert_log_follows_firing_repeats_and_resolution() -> None:
    log = AlertLog(load_config(None))
    base = {"alert_id": "broker_fault|c|b", "kind": "broker_fault", "summary": "s"}
    log._take({**base, "status": "firing", "ts_ms": 10})
    log._take({**base, "status": "firing", "ts_ms": 20})  # a repeat keeps the first firing
    log._take({**base, "status": "resolved", "ts_ms": 40, "ends_ms": 30})
    assert log.stories() == [AlertStory("broker_fault|c|b", "broker_fault", "s", 10, 30)]
    log._take({**base, "status": "firing", "ts_ms": 50})  # back again: a new story
    assert log.stories("broker_fault") == [AlertStory("broker_fault|c|b", "broker_fault", "s", 50)]
    assert log.stories("consumer_lag") == []
