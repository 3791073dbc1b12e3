"""When an episode closes: on evidence of recovery, never on silence alone (pipeline.faults.episodes).

A killed broker drops out of the producers' routes, so the fleet stops sending to it and no rule
holds while it is still dead. Each case runs one broker's grid points through the rule
(:func:`advance_episode`) or through :func:`evaluate_points` (which skips the points without
data), and states where the episode closed and why.
"""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError, FaultsConfig
from pipeline.faults.episodes import (
    QUORUM,
    RECOVERY,
    SILENCE,
    Episode,
    Point,
    advance_episode,
    evaluate_points,
    healthy_bucket,
)

CFG = FaultsConfig(episode_close_after_s=30.0, episode_max_silence_s=120.0)  # grid 5 s, failure rate 0.5
STEP = 5_000
SIGNAL = "signal"  # a grid point where a rule holds
SILENT = Point()  # nobody sent to the broker in the interval
HEALTHY = Point(bucket_sends=40, bucket_failures=1)
FAILING = Point(bucket_sends=40, bucket_failures=30)  # back, but failing (under every rule's other thresholds)
QUORUM_POINT = Point(avoiding=6, active=8, bucket_sends=40, bucket_failures=40)


def run(script: list[tuple[int, str | Point]], cfg: FaultsConfig = CFG) -> Episode:
    """The broker's grid points ``(seconds, SIGNAL or its Point)`` in order, through the rule; the
    episode opens at the first (a signal). Returns it, closed or still open after the last point."""
    ep: Episode | None = None
    for second, what in script:
        reason, point = (QUORUM, QUORUM_POINT) if what == SIGNAL else (None, what)
        assert isinstance(point, Point)
        was = ep
        ep, done = advance_episode(ep, 0, second * 1000, reason, point, cfg, STEP)
        if done is not None:
            return done
        assert ep is not None, f"{second}s: the episode vanished without closing"
        assert was is None or ep is was
    assert ep is not None
    return ep


def every(start_s: int, stop_s: int, what: str | Point) -> list[tuple[int, str | Point]]:
    """One entry per grid point in ``[start_s, stop_s)``."""
    return [(s, what) for s in range(start_s, stop_s, STEP // 1000)]


def test_healthy_sends_right_after_the_last_signal_close_it_after_close_after() -> None:
    # the simulator's outages: the fleet keeps sending, the broker answers again at 25 s
    ep = run(every(0, 25, SIGNAL) + every(25, 200, HEALTHY))
    assert (ep.closed, ep.closed_by) == (25_000, RECOVERY)  # where the healthy stretch began
    # decided at the point that completes 30 s of healthy sends: 25..55 s, as the rule before silence counted


def test_silence_keeps_it_open_however_long_the_close_delay() -> None:
    ep = run(every(0, 10, SIGNAL) + every(10, 120, SILENT))
    assert ep.closed is None and ep.closed_by is None  # 110 s of nothing: still open (close_after is 30 s)


def test_sends_after_the_silence_close_it_close_after_once_they_succeed() -> None:
    # killed at 0, routes dropped at 10 s, back at 100 s: the close is where sends succeeded again
    ep = run(every(0, 10, SIGNAL) + every(10, 100, SILENT) + every(100, 200, HEALTHY))
    assert (ep.closed, ep.closed_by) == (100_000, RECOVERY)


def test_a_broker_back_but_still_failing_stays_open_past_the_silence_bound() -> None:
    ep = run(every(0, 10, SIGNAL) + every(10, 60, SILENT) + every(60, 400, FAILING))
    assert ep.closed is None  # heard of all along (failing sends): neither recovered nor silent
    ep = run(every(0, 10, SIGNAL) + every(10, 60, SILENT) + every(60, 400, FAILING) + every(400, 500, HEALTHY))
    assert (ep.closed, ep.closed_by) == (400_000, RECOVERY)


def test_a_failing_interval_restarts_the_healthy_stretch() -> None:
    script = every(0, 10, SIGNAL) + every(10, 30, HEALTHY) + [(30, FAILING)] + every(35, 200, HEALTHY)
    ep = run(script)
    assert (ep.closed, ep.closed_by) == (35_000, RECOVERY)


def test_sparse_healthy_sends_close_it_at_a_point_with_sends() -> None:
    # a trickle: one healthy interval in four; nothing bad in between
    script = every(0, 10, SIGNAL) + [(s, HEALTHY if s % 20 == 10 else SILENT) for s in range(10, 200, 5)]
    ep = run(script)
    # healthy at 10, 30, 50: at 50 the stretch from 10 is 45 s; it closed 30 s (on the grid) back
    assert (ep.closed, ep.closed_by) == (25_000, RECOVERY)


def test_the_silence_bound_closes_it_and_says_so() -> None:
    ep = run(every(0, 10, SIGNAL) + every(10, 300, SILENT))
    # the last signal at 5 s, then 120 s of nothing: closed at 125 s, by silence
    assert (ep.closed, ep.closed_by) == (125_000, SILENCE)
    # failing sends are news of the broker: the bound counts from the last of them
    ep = run(every(0, 10, SIGNAL) + [(10, FAILING)] + every(15, 300, SILENT))
    assert (ep.closed, ep.closed_by) == (130_000, SILENCE)


def test_the_silence_bound_falls_between_the_grid_points_that_have_data() -> None:
    """``evaluate_points`` runs only the points with data; a silent episode closes at its bound between
    them, and at the end of the range evaluated, whichever comes first."""
    eps: dict[int, Episode] = {}
    closed = evaluate_points(eps, [0, 5_000], [{0: QUORUM_POINT, 1: HEALTHY, 2: HEALTHY}] * 2, CFG, until=5_000)
    assert closed == [] and set(eps) == {0}
    later = [{0: HEALTHY, 1: HEALTHY, 2: HEALTHY}]
    closed = evaluate_points(eps, [400_000], later, CFG, until=400_000)
    assert [(e.broker, e.closed, e.closed_by) for e in closed] == [(0, 125_000, SILENCE)] and eps == {}
    evaluate_points(eps, [0], [{0: QUORUM_POINT, 1: HEALTHY, 2: HEALTHY}], CFG, until=0)
    assert evaluate_points(eps, [], [], CFG, until=119_999) == [] and set(eps) == {0}
    [done] = evaluate_points(eps, [], [], CFG, until=120_000)
    assert (done.closed, done.closed_by) == (120_000, SILENCE)


@pytest.mark.parametrize("point,healthy", [
    (Point(bucket_sends=10, bucket_failures=0), True),
    (Point(bucket_sends=10, bucket_failures=4), True),
    (Point(bucket_sends=10, bucket_failures=5), False),  # at the failure-outlier rate: failing
    (Point(bucket_sends=0), False),  # silence is no evidence
    (Point(sends=100, p99=10.0), False),  # sends in the trailing window, none in this interval
])
def test_healthy_bucket(point: Point, healthy: bool) -> None:
    assert healthy_bucket(point, CFG) is healthy


@pytest.mark.parametrize("silence,close_after", [(0.0, 0.0), (-1.0, 30.0), (20.0, 30.0)])
def test_the_silence_bound_is_validated(silence: float, close_after: float) -> None:
    with pytest.raises(ConfigError, match="faults.episode_max_silence_s"):
        FaultsConfig(episode_close_after_s=close_after, episode_max_silence_s=silence).validate()


def test_an_open_episode_from_a_state_written_before_the_silence_rule_reads_as_heard_at_its_last_signal() -> None:
    """A checkpoint of version 5 holds open episodes without ``last_heard`` and ``recovering``: they
    load as heard of last at their last signal, with no healthy stretch under way, which is what the
    running state holds for an episode signalled at its last point (here: broker-c, killed at 60 s,
    out of the routes from 70 s, its failures alone in the trailing window at 120 s)."""
    from pipeline.faults import from_send_results
    from pipeline.faults.codec import _TABLES, _compressed, decode_state, encode_state
    from pipeline.faults.episodes import EPISODE_SCHEMA_V5
    from pipeline.faults.frame import take, to_bytes
    from pipeline.faults.state import initial_state, step
    from tests.doubles.faults_synth import T0, dropped_from_routes

    cols = from_send_results(dropped_from_routes(None))
    state, _ = step(initial_state("DefaultCluster"), take(cols, cols["ts_ms"] <= T0 + 121_000), 0, FaultsConfig(),
                    None, T0 + 121_000)
    [last_signal] = state.episodes["last_signal"].tolist()
    assert state.episodes["last_heard"].tolist() == [last_signal] == [T0 + 120_000]
    assert state.episodes["recovering"].tolist() == [-1]
    row = encode_state(state)
    v5 = tuple(_compressed(to_bytes(getattr(state, name), EPISODE_SCHEMA_V5 if name == "episodes" else schema), 5)
               if blob else b"" for (name, schema), blob in zip(_TABLES, row[2:]))
    assert encode_state(decode_state((5, row[1], *v5))) == row
