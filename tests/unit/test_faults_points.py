"""The vectorised grid points of one broker (pipeline.faults.points.broker_points) equal the
per-tick reference (pipeline.faults.episodes.points_at) on random sends and windows."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import FaultsConfig
from pipeline.faults import episodes as ep_mod
from pipeline.faults.points import broker_points

ERRORS = ("E_TIMEOUT", "E_BUSY", "E_REFUSED")


def random_broker(rng: np.random.Generator, n: int, n_wins: int, producers: int) -> tuple[dict, dict]:
    ts = np.sort(rng.integers(0, 120_000, n) // 250 * 250).astype(np.int64)  # with ties
    failed = rng.random(n) < 0.05
    sends = {
        "broker": np.full(n, 3, dtype=np.int32), "ts": ts,
        "latency": np.where(rng.random(n) < 0.05, rng.integers(550, 4000, n), rng.integers(1, 40, n)).astype(np.int64),
        "pair": rng.integers(0, producers, n).astype(np.int64), "failed": failed,
        "err": np.where(failed, rng.integers(0, len(ERRORS), n), 0).astype(np.int32),
    }
    start = rng.integers(0, 120_000, n_wins).astype(np.int64)
    wins = {"broker": np.full(n_wins, 3, dtype=np.int32), "start": start,
            "end": start + rng.integers(1, 60_000, n_wins), "pair": rng.integers(0, producers + 5, n_wins).astype(np.int64),
            "enable": rng.random(n_wins) < 0.7}
    return sends, wins


@pytest.mark.parametrize("shadow", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_broker_points_equal_points_at(seed: int, shadow: bool) -> None:
    rng = np.random.default_rng(seed)
    cfg = FaultsConfig(quorum_counts_shadow_windows=shadow)
    n = int(rng.choice([0, 1, 7, 300, 3000]))
    sends, wins = random_broker(rng, n, int(rng.integers(0, 30)), int(rng.choice([3, 50, 500])))
    ticks = np.arange(-5, 40, dtype=np.int64) * 5_000
    expected = ep_mod.points_at(ticks, sends, wins, [3], ERRORS, cfg)
    use = np.ones(len(wins["pair"]), dtype=bool) if shadow else wins["enable"]
    points, seen = broker_points(ticks, sends, wins["start"][use], wins["end"][use], wins["pair"][use], ERRORS, cfg)
    assert [e[3] for e in expected] == points
    act_ms = int(cfg.active_producer_window_s * 1000)
    assert seen == [bool(((sends["ts"] > t - act_ms) & (sends["ts"] <= t)).any()) for t in ticks.tolist()]


def test_long_ranges_are_counted_in_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backlog's long ranges go through the (ticks x rows) grid a few ticks at a time."""
    from pipeline.faults import points

    rng = np.random.default_rng(1)
    sends, wins = random_broker(rng, 3000, 10, 200)
    ticks = np.arange(0, 25, dtype=np.int64) * 5_000
    whole = broker_points(ticks, sends, wins["start"], wins["end"], wins["pair"], ERRORS, FaultsConfig())
    monkeypatch.setattr(points, "_GRID_CELLS", 500)
    assert broker_points(ticks, sends, wins["start"], wins["end"], wins["pair"], ERRORS, FaultsConfig()) == whole
