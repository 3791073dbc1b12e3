"""A publisher cycle's identity is its time in ms: comparable across intervals, readable in messages."""

from __future__ import annotations

import pytest

from pipeline.publish import cycle_number_for
from pipeline.publish.cycle import describe_cycle

T = 1_795_554_365_123  # 2026-11-24T21:06:05.123Z


@pytest.mark.parametrize(
    ("interval_s", "expected"),
    [(60.0, 1_795_554_360_000), (10.0, 1_795_554_360_000), (1.0, 1_795_554_365_000), (0.5, 1_795_554_365_000),
     (3600.0, 1_795_554_000_000)],
)
def test_a_cycle_is_its_time_aligned_down_to_the_interval(interval_s: float, expected: int) -> None:
    assert cycle_number_for(T, interval_s) == expected
    assert cycle_number_for(expected, interval_s) == expected  # an aligned time is its own cycle


def test_identities_order_by_time_whatever_the_interval() -> None:
    # The bug this replaces: floor(t / 10 s) of the demo outranked floor(t / 60 s) of the DAG forever.
    assert cycle_number_for(T, 10.0) < cycle_number_for(T + 60_000, 60.0) < cycle_number_for(T + 70_000, 10.0)


def test_describe_shows_the_time() -> None:
    assert describe_cycle(1_795_554_360_000) == "cycle 1795554360000 (2026-11-24T21:06:00.000Z)"
    assert describe_cycle(29_925_834) == "cycle 29925834"  # a number forced by hand, not a time


@pytest.mark.parametrize(("args", "said"), [
    (["--cycles", "2"], "--cycles needs --every or --watch and at least 1"),
    (["--every", "--cycles", "0"], "--cycles needs --every or --watch and at least 1"),
    (["--watch", "--cycles", "0"], "--cycles needs --every or --watch and at least 1"),
    (["--every", "--watch"], "--every already runs the early cycles"),
])
def test_publish_loop_arguments_are_checked(args: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    from faultwatch.cli import main

    assert main(["publish", *args]) == 2  # refused before any configuration is read or table touched
    assert said in capsys.readouterr().err
