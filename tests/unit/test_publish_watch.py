"""Early cycles: the episode watch over a real Delta table, and the loop that runs them between regular ones."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.config import Config, ConfigError, from_dict
from pipeline.publish.watch import EpisodeWatch, cycle_loop

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "airflow"))
from dag_inputs import S, episode_row, write

NOW = 1_800_000_000_000


def suspected(broker: str, opened: int, revision: int = 0) -> dict:
    return episode_row(broker, opened, revision, NOW) | {"state": "suspected"}


def test_a_missing_table_has_no_episode_and_its_first_ones_are_new(cfg: Config) -> None:
    watch = EpisodeWatch(cfg.storage.root)
    assert watch.new_episodes() == []  # no table yet: nothing seen, nothing new
    write(cfg.storage.root, "broker_fault_episodes_live", [episode_row("b2", NOW - 60 * S, 0, NOW)])
    assert watch.new_episodes() == [f"c1|b2|{NOW - 60 * S}"]
    assert watch.new_episodes() == []


def test_episodes_open_at_the_first_look_are_not_new(cfg: Config) -> None:
    write(cfg.storage.root, "broker_fault_episodes_live", [episode_row("b2", NOW - 60 * S, 0, NOW)])
    watch = EpisodeWatch(cfg.storage.root)
    assert watch.new_episodes() == []  # the first cycle (or the DAG) had it


def test_each_episode_is_new_once_suspected_or_open_and_never_when_closed(cfg: Config) -> None:
    root = cfg.storage.root
    write(root, "broker_fault_episodes_live", [episode_row("b1", NOW - 600 * S, 0, NOW, closed=NOW - 500 * S)])
    watch = EpisodeWatch(root)
    assert watch.new_episodes() == []
    write(root, "broker_fault_episodes_live", [suspected("b2", NOW - 10 * S)])
    assert watch.new_episodes() == [f"c1|b2|{NOW - 10 * S}"]
    # the same episode opened (same id, next revision), then a closed one and a later revision of b1: none new
    write(root, "broker_fault_episodes_live", [episode_row("b2", NOW - 10 * S, 1, NOW),
                                                episode_row("b3", NOW - 90 * S, 0, NOW, closed=NOW - 20 * S)])
    assert watch.new_episodes() == []
    # two at once, one of them withdrawn right away: only the live one
    write(root, "broker_fault_episodes_live", [suspected("b4", NOW - 5 * S), suspected("b3", NOW - 5 * S),
                                                suspected("b3", NOW - 5 * S, 1) | {"state": "withdrawn"}])
    assert watch.new_episodes() == [f"c1|b4|{NOW - 5 * S}"]


def test_an_unchanged_table_is_not_read_again(cfg: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    write(cfg.storage.root, "broker_fault_episodes_live", [episode_row("b2", NOW - 60 * S, 0, NOW)])
    watch = EpisodeWatch(cfg.storage.root)
    watch.new_episodes()
    reads: list[int] = []
    real = watch._live
    monkeypatch.setattr(watch, "_live", lambda: reads.append(1) or real())
    assert [watch.new_episodes() for _ in range(5)] == [[]] * 5
    assert reads == []
    write(cfg.storage.root, "broker_fault_episodes_live", [suspected("b3", NOW)])
    assert watch.new_episodes() == [f"c1|b3|{NOW}"]
    assert reads == [1]


def wait_for(predicate, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.02)


def test_a_new_episode_starts_a_cycle_between_regular_ones(cfg: Config) -> None:
    """The regular cycle is an hour away: only the watch can run the second cycle, with the time as its id."""
    c = cfg.replace(publish__interval_s=3600.0, publish__watch_interval_s=0.05)
    write(c.storage.root, "broker_fault_episodes_live", [episode_row("b1", NOW - 60 * S, 0, NOW)])
    runs: list[int | None] = []
    stop = threading.Event()
    loop = threading.Thread(target=lambda: cycle_loop(c, runs.append, stop=stop))
    loop.start()
    try:
        wait_for(lambda: len(runs) == 1)  # the regular cycle at start
        before = int(time.time() * 1000)
        write(c.storage.root, "broker_fault_episodes_live", [suspected("b2", NOW)])
        wait_for(lambda: len(runs) == 2)
        early = runs[1]
        assert runs[0] is None and early is not None and early >= before
        write(c.storage.root, "broker_fault_episodes_live", [episode_row("b2", NOW, 1, NOW)])  # opened: not new
        write(c.storage.root, "broker_fault_episodes_live", [suspected("b3", NOW)])
        wait_for(lambda: len(runs) == 3)
    finally:
        stop.set()
        loop.join(30)
    assert not loop.is_alive()
    assert runs[0] is None and all(isinstance(n, int) for n in runs[1:]) and len(runs) == 3


def test_a_failing_cycle_does_not_stop_the_loop_and_cycles_bounds_it(cfg: Config) -> None:
    c = cfg.replace(publish__interval_s=0.05, publish__watch_interval_s=0.0)
    calls: list[int | None] = []

    def run(number: int | None) -> None:
        calls.append(number)
        raise RuntimeError("Kafka down")

    assert cycle_loop(c, run, cycles=3) == 3
    assert calls == [None, None, None]


def test_watch_only_needs_a_watch_interval(cfg: Config) -> None:
    with pytest.raises(ValueError, match="watch_interval_s"):
        cycle_loop(cfg.replace(publish__watch_interval_s=0.0), lambda n: None, regular=False)
    with pytest.raises(ConfigError, match="publish.watch_interval_s"):
        from_dict({"publish": {"watch_interval_s": -1.0}})


def test_an_episode_committed_while_a_regular_cycle_runs_gets_its_early_cycle_right_after(cfg: Config) -> None:
    """The cycle read its inputs before the episode was there; the next look is 1,000 s away, so only the
    look right after the cycle can start the early one. An episode there before the cycle starts is its own."""
    c = cfg.replace(publish__interval_s=3600.0, publish__watch_interval_s=1000.0)
    write(c.storage.root, "broker_fault_episodes_live", [suspected("b1", NOW)])  # the first cycle's
    runs: list[int | None] = []

    def run(number: int | None) -> None:
        if not runs:
            write(c.storage.root, "broker_fault_episodes_live", [suspected("b2", NOW)])
        runs.append(number)

    assert cycle_loop(c, run, cycles=2) == 2
    assert runs[0] is None and isinstance(runs[1], int)


def test_a_broken_table_is_said_once_and_the_loop_goes_on(cfg: Config, caplog: pytest.LogCaptureFixture) -> None:
    """A corrupt newest commit (a full disk, a bad copy): the regular cycles go on, the warning comes
    once, not once a look; once the table is readable again a new episode starts its cycle."""
    from dag_inputs import cut_newest_commit

    c = cfg.replace(publish__interval_s=3600.0, publish__watch_interval_s=0.02)
    root = c.storage.root
    write(root, "broker_fault_episodes_live", [episode_row("b1", NOW, 0, NOW)])
    write(root, "broker_fault_episodes_live", [suspected("b2", NOW)])
    cut_newest_commit(root, "broker_fault_episodes_live")
    runs: list[int | None] = []
    stop = threading.Event()
    loop = threading.Thread(target=lambda: cycle_loop(c, runs.append, stop=stop))
    with caplog.at_level("INFO", logger="pipeline.publish.watch"):
        loop.start()
        try:
            wait_for(lambda: len(runs) == 1 and "cannot read" in caplog.text)
            time.sleep(0.5)  # some 25 looks at the broken table
            assert caplog.text.count("cannot read") == 1 and runs == [None]
            import shutil

            shutil.rmtree(Path(root) / "broker_fault_episodes_live")  # replaced: written afresh
            write(root, "broker_fault_episodes_live", [suspected("b3", NOW)])
            wait_for(lambda: len(runs) == 2)
        finally:
            stop.set()
            loop.join(30)
    assert "can be read again" in caplog.text and isinstance(runs[1], int)
