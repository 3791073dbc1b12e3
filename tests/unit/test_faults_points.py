"""A broker's grid points (pipeline.faults.episodes.broker_points, points_at over several brokers)
equal a plain per-tick count with sets, on random sends with ties, windows and shadow windows."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pipeline.config import FaultsConfig
from pipeline.faults import episodes as ep_mod
from pipeline.faults.episodes import Point, broker_points, points_at

ERRORS = ("E_TIMEOUT", "E_BUSY", "E_REFUSED")
TICKS = np.arange(-5, 40, dtype=np.int64) * 5_000


def random_log(rng: np.random.Generator, n: int, n_wins: int, producers: int, brokers: int = 1) -> tuple[dict, dict]:
    ts = np.sort(rng.integers(0, 120_000, n) // 250 * 250).astype(np.int64)  # with ties
    failed = rng.random(n) < 0.05
    log = {
        "broker": rng.integers(0, brokers, n).astype(np.int32), "ts": ts,
        "latency": np.where(rng.random(n) < 0.05, rng.integers(550, 4000, n), rng.integers(1, 40, n)).astype(np.int64),
        "pair": rng.integers(0, producers, n).astype(np.int64), "failed": failed,
        "err": np.where(failed, rng.integers(0, len(ERRORS), n), 0).astype(np.int32),
    }
    start = rng.integers(0, 120_000, n_wins).astype(np.int64)
    wins = {"broker": rng.integers(0, brokers, n_wins).astype(np.int32), "start": start,
            "end": start + rng.integers(1, 60_000, n_wins),
            "pair": rng.integers(0, producers + 5, n_wins).astype(np.int64), "enable": rng.random(n_wins) < 0.7}
    return log, wins


def plain_points(log: dict, wins: dict, broker: int, cfg: FaultsConfig) -> tuple[list[Point], list[bool]]:
    """The rules' definitions, one tick and one set at a time."""
    act, out, bucket = (int(s * 1000) for s in (cfg.active_producer_window_s, cfg.outlier_window_s,
                                                 cfg.evaluation_interval_s))
    mine = [i for i in range(len(log["ts"])) if log["broker"][i] == broker]
    counted = [j for j in range(len(wins["pair"]))
               if wins["broker"][j] == broker and (cfg.quorum_counts_shadow_windows or wins["enable"][j])]
    points, seen = [], []
    for t in TICKS.tolist():
        def within(span: int, t: int = t) -> list[int]:
            return [i for i in mine if t - span < log["ts"][i] <= t]

        in_act, in_out, in_bucket = within(act), within(out), within(bucket)
        avoiding = {int(wins["pair"][j]) for j in counted if wins["start"][j] <= t < wins["end"][j]}
        p = Point(avoiding=len(avoiding), active=len({int(log["pair"][i]) for i in in_act} | avoiding),
                  sends=len(in_out), failures=sum(bool(log["failed"][i]) for i in in_out),
                  bucket_sends=len(in_bucket), bucket_failures=sum(bool(log["failed"][i]) for i in in_bucket))
        if in_out:
            p.p99 = ep_mod.quantile(log["latency"][in_out], 0.99)
            p.failing = len({int(log["pair"][i]) for i in in_out if log["failed"][i]})
            p.slow = len({int(log["pair"][i]) for i in in_out if log["latency"][i] >= cfg.outlier_min_latency_ms})
        p.bucket_errors = Counter(ERRORS[log["err"][i]] for i in in_bucket if log["failed"][i])
        points.append(p)
        seen.append(bool(in_act))
    return points, seen


@pytest.mark.parametrize("shadow", [True, False])
@pytest.mark.parametrize("seed", range(10))
def test_broker_points_count_what_the_rules_define(seed: int, shadow: bool) -> None:
    rng = np.random.default_rng(seed)
    cfg = FaultsConfig(quorum_counts_shadow_windows=shadow)
    log, wins = random_log(rng, int(rng.choice([0, 1, 7, 300, 1500])), int(rng.integers(0, 30)),
                           int(rng.choice([3, 50, 500])))
    use = np.ones(len(wins["pair"]), dtype=bool) if shadow else wins["enable"]
    got = broker_points(TICKS, log, wins["start"][use], wins["end"][use], wins["pair"][use], ERRORS, cfg)
    assert got == plain_points(log, wins, 0, cfg)


@pytest.mark.parametrize("seed", range(4))
def test_points_at_splits_the_log_by_broker(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    cfg = FaultsConfig(quorum_counts_shadow_windows=bool(seed % 2))
    log, wins = random_log(rng, 1200, 40, 80, brokers=4)
    order = rng.permutation(len(log["ts"]))  # the log is not in time order
    log = {name: values[order] for name, values in log.items()}
    got = points_at(TICKS, log, wins, [0, 1, 2, 3], ERRORS, cfg)
    for b in range(4):
        assert [per_tick[b] for per_tick in got] == plain_points(log, wins, b, cfg)[0]


@pytest.mark.parametrize("seed", range(6))
def test_distinct_counts_per_range_equal_a_set_per_range(seed: int) -> None:
    """Ascending bounds as the ticks give them: repeated, empty and backlog-long ranges."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 1 + 3 * seed, 500)
    lo = np.sort(rng.integers(0, 501, 40))
    hi = np.maximum(lo, np.sort(rng.integers(0, 501, 40)))
    hi = np.maximum.accumulate(hi)
    want = [len(set(values[a:b].tolist())) for a, b in zip(lo.tolist(), hi.tolist())]
    assert ep_mod._distinct(values, lo, hi).tolist() == want


@pytest.mark.parametrize("seed", range(6))
def test_grid_columns_of_several_brokers_equal_each_brokers_own(seed: int) -> None:
    """forecasts computes every broker of a state in one pass, each a block of rows and ticks."""
    rng = np.random.default_rng(200 + seed)
    cfg = FaultsConfig(quorum_counts_shadow_windows=bool(seed % 2))
    log, wins = random_log(rng, int(rng.choice([0, 40, 1500])), int(rng.integers(0, 40)), 30, brokers=4)
    order = np.lexsort((log["ts"], log["broker"]))
    log = {name: values[order] for name, values in log.items()}
    use = np.ones(len(wins["pair"]), dtype=bool) if cfg.quorum_counts_shadow_windows else wins["enable"]
    blocks = [0, 2, 3]  # broker 1 left out: its rows and windows must not count
    ticks = [np.sort(rng.choice(TICKS, int(rng.integers(0, len(TICKS))), replace=False)) for _ in blocks]
    rows = np.flatnonzero(np.isin(log["broker"], blocks))
    wsel = np.flatnonzero(use & np.isin(wins["broker"], blocks))
    got = ep_mod.grid_columns(
        np.concatenate(ticks), np.repeat(np.arange(len(blocks)), [len(t) for t in ticks]),
        {name: values[rows] for name, values in log.items()}, np.searchsorted(blocks, log["broker"][rows]),
        wins["start"][wsel], wins["end"][wsel], wins["pair"][wsel], np.searchsorted(blocks, wins["broker"][wsel]),
        ERRORS, cfg)
    at = 0
    for b, mine in zip(blocks, ticks):
        sel = log["broker"] == b
        w = use & (wins["broker"] == b)
        want = ep_mod.broker_columns(mine, {name: values[sel] for name, values in log.items()},
                                     wins["start"][w], wins["end"][w], wins["pair"][w], ERRORS, cfg)
        for name, values in want.items():
            if name == "bucket_errors":
                assert {k: v for k, v in got[name].items() if at <= k < at + len(mine)} == \
                    {k + at: v for k, v in values.items()}
            else:
                assert got[name][at:at + len(mine)].tolist() == values.tolist(), name
        at += len(mine)
