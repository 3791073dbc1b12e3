"""Fault state per shard of brokers + the cluster decision over their points == one state for the cluster.

The combined query keeps the fault state per (cluster, shard of its brokers) and decides episodes
on the brokers' grid points (pipeline.faults.points, pipeline.faults.cluster). Run both ways over
the simulator's outage in micro-batches, as the query calls them (a key with events in a batch is
stepped to the batch's settle point, an idle one once the watermark reaches its wake-up time),
they must write the same windows, health rows and episode rows; and the point rows must not
depend on which brokers share a state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from pipeline.config import FaultsConfig
from pipeline.faults import from_send_results, initial_state, step
from pipeline.faults.cluster import ClusterState, cluster_step, dumps, loads
from pipeline.faults.codec import decode_state, encode_state
from pipeline.faults.frame import take
from pipeline.simulate import MemorySink, Simulation
from streaming.feeds import shard_of
from tests.doubles.faults_reference import current_view
from tests.doubles.faults_synth import T0, dropped_from_routes, outage_scenario, random_stream

CFG = FaultsConfig()
DELAY = 30_000


def batches_of(cols: Any, size_ms: int) -> list[tuple[Any, int]]:
    ts = cols["ts_ms"]
    out, lo = [], int(ts.min())
    while lo <= int(ts.max()):
        out.append((take(cols, (ts >= lo) & (ts < lo + size_ms)), lo + size_ms - DELAY))
        lo += size_ms
    out.append((take(cols, ts < 0), int(ts.max()) + 1))  # the end: everything settles
    return out


def one_state(batches: list[tuple[Any, int]], cfg: FaultsConfig = CFG, through_codec: bool = False) -> dict[str, list[dict]]:
    state, previous = initial_state("DefaultCluster"), 0
    rows: dict[str, list[dict]] = {"windows": [], "episodes": [], "health": [], "quarantine": []}
    for events, settle in batches:
        state, out = step(state, events, previous, cfg, None, settle)
        if through_codec:
            state = decode_state(encode_state(state))
        for key in rows:
            rows[key] += getattr(out, key)
        previous = settle
    return rows


def by_broker(broker: str) -> str:
    return broker


def by_shard(shards: int) -> Callable[[str], str]:
    return lambda broker: str(shard_of(pa.array([broker]), shards)[0])


def per_key(
    batches: list[tuple[Any, int]], through_json: bool, key_of: Callable[[str], str] = by_broker,
    deciders: list[ClusterState] | None = None, forget_when_quiet: str | None = None, cfg: FaultsConfig = CFG,
) -> dict[str, list[dict]]:
    """The query's way: one points-mode state per ``key_of(broker)``, the decision over their points.

    ``rows["points"]`` holds each batch's point rows (canonical), one entry per batch. ``deciders``
    (if given) gets the cluster state after each batch; ``forget_when_quiet`` names a broker whose
    points the cluster state drops before each batch without its events (a broken decision).
    """
    states: dict[str, Any] = {}
    wakeups: dict[str, int | None] = {}
    decider = ClusterState("DefaultCluster")
    rows: dict[str, list[Any]] = {"windows": [], "episodes": [], "health": [], "quarantine": [], "points": []}
    previous = 0
    for events, settle in batches:
        keys = np.asarray([key_of(b) for b in events["broker_name"].tolist()], dtype=object)
        points: list[dict] = []
        for key in sorted(set(keys.tolist()) | set(states)):
            mine = take(events, keys == key)
            if mine["ts_ms"].size:
                state, out = step(states.get(key) or initial_state("DefaultCluster"), mine, previous, cfg,
                                  None, settle, points=True)
            elif wakeups.get(key) is not None and previous >= wakeups[key]:  # an event-time timeout
                state, out = step(states[key], mine, previous, cfg, None, previous, points=True)
            else:
                continue
            states[key], wakeups[key] = state, out.wakeup_ms
            points += out.points.to_pylist() if out.points is not None else []
            for name in ("windows", "health", "quarantine"):
                rows[name] += getattr(out, name)
        if forget_when_quiet is not None and forget_when_quiet not in events["broker_name"].tolist():
            decider = replace(decider, points={b: p for b, p in decider.points.items() if b != forget_when_quiet})
        decider, episodes = cluster_step(decider, points, settle, cfg)
        if deciders is not None:
            deciders.append(decider)
        if through_json:
            decider = loads(dumps({"DefaultCluster": decider}))["DefaultCluster"]
        rows["episodes"] += episodes
        rows["points"].append(canon(points))
        previous = settle
    return rows


@pytest.fixture(scope="module")
def outage() -> Any:
    sim = Simulation(outage_scenario())
    sink = MemorySink()
    sim.run(sink)
    return from_send_results(sink.events("send_result"))


def canon(rows: list[dict]) -> list[str]:
    return sorted(repr(sorted(r.items())) for r in rows)


@pytest.mark.parametrize("shards", [None, 2, 8])
@pytest.mark.parametrize("size_ms", [5_000, 41_000])
def test_per_key_states_and_the_cluster_decision_write_what_one_state_writes(
    outage: Any, size_ms: int, shards: int | None,
) -> None:
    batches = batches_of(outage, size_ms)
    want = one_state(batches)
    got = per_key(batches, through_json=size_ms == 5_000, key_of=by_broker if shards is None else by_shard(shards))
    assert want["episodes"], "the outage opens an episode"
    for key in ("windows", "health", "quarantine", "episodes"):
        assert canon(got[key]) == canon(want[key]), key


@pytest.mark.parametrize("size_ms", [5_000, 41_000])
def test_a_state_of_several_brokers_writes_the_point_rows_of_one_broker_states(outage: Any, size_ms: int) -> None:
    batches = batches_of(outage, size_ms)
    alone = per_key(batches, through_json=False)
    for key_of in (by_shard(2), lambda broker: "all"):
        assert per_key(batches, through_json=False, key_of=key_of)["points"] == alone["points"]
    assert sum(map(len, alone["points"])) > 0


def test_two_brokers_in_one_state_when_only_one_of_them_gets_events() -> None:
    cols = from_send_results(random_stream(7, producers=8, brokers=2, events=1200, span_ms=180_000,
                                           cluster="DefaultCluster"))
    ts, names = cols["ts_ms"], cols["broker_name"]
    t0 = int(ts.min())
    # broker-1 is quiet from 60 s to 120 s: batches with events of broker-0 only
    cols = take(cols, (names == "broker-0") | (ts < t0 + 60_000) | (ts >= t0 + 120_000))
    batches = batches_of(cols, 10_000)
    by_batch = [set(events["broker_name"].tolist()) for events, _ in batches]
    assert {"broker-0"} in by_batch and {"broker-0", "broker-1"} in by_batch
    alone = per_key(batches, through_json=False)
    together = per_key(batches, through_json=False, key_of=lambda broker: "both")
    assert together["points"] == alone["points"]
    for (events, _), points in zip(batches, together["points"]):
        # a forecast (header row first) for each broker with events in the batch, and no other
        emitted = {row.split("'broker_name', '")[1].split("'")[0] for row in points}
        assert emitted == set(events["broker_name"].tolist())
    for name in ("windows", "health", "quarantine", "episodes"):
        assert canon(together[name]) == canon(alone[name]), name


def test_a_broker_without_events_keeps_its_forecast(outage: Any) -> None:
    # The dead broker's producers stop sending to it: in those batches its state is not stepped and
    # writes no point, and the cluster state keeps the forecast it wrote last, which still counts
    # towards the quorum (the decision with that forecast dropped writes other episodes).
    batches = batches_of(outage, 5_000)
    deciders: list[ClusterState] = []
    got = per_key(batches, through_json=False, deciders=deciders)
    kept = 0
    for i, (events, settle) in enumerate(batches[:-1]):
        if i == 0 or "broker-c" in events["broker_name"].tolist():
            continue
        assert not any("'broker-c'" in row for row in got["points"][i]), f"batch {i}: broker-c wrote points"
        before, after = deciders[i - 1].points.get("broker-c", {}), deciders[i].points.get("broker-c", {})
        ahead = {t: row for t, row in before.items() if t > settle}  # not decided yet: must all be kept
        assert {t: after.get(t) for t in ahead} == ahead, f"batch {i}: broker-c's forecast changed"
        kept += len(ahead)
    assert kept > 0, "no batch without broker-c's events had its forecast ahead"
    want = one_state(batches)
    assert canon(got["episodes"]) == canon(want["episodes"])
    forgot = per_key(batches, through_json=False, forget_when_quiet="broker-c")
    assert canon(forgot["episodes"]) != canon(want["episodes"]), "dropping the forecast changed nothing"


@pytest.mark.parametrize("back_s", [190, None], ids=["back-at-190s", "never-back"])
def test_a_broker_dropped_from_the_routes_keeps_its_episode_until_it_is_back_whichever_way_it_is_run(
    back_s: int | None,
) -> None:
    """broker-c refuses connections from 60 s (its episode opens at the grid point after) and nobody
    sends to it from 70 s: the producers' windows hold the quorum to 75 s, its failures alone in the
    trailing window the failure-outlier rule from 110 s to 125 s (the last signal), then silence.
    The episode closes where sends to it succeed again (195 s: its first sends back fall in the
    interval ending there), or, never back, at the silence bound (125 s + 120 s), saying so. Streamed
    in micro-batches of two sizes (the state through its codec), per shard with the cluster
    decision (through JSON), and replayed in one batch: the same rows."""
    cfg = replace(CFG, episode_max_silence_s=120.0)
    cols = from_send_results(dropped_from_routes(back_s))
    one_batch = [(cols, int(cols["ts_ms"].max()) + 1)]
    finals = []
    for batches in (batches_of(cols, 5_000), batches_of(cols, 41_000), one_batch):
        want = one_state(batches, cfg, through_codec=True)
        got = per_key(batches, through_json=True, key_of=by_shard(2), cfg=cfg)
        assert canon(got["episodes"]) == canon(want["episodes"])
        finals.append([{k: v for k, v in r.items() if k != "revision"} for r in current_view(want["episodes"], "episode_id")])
    assert finals[1] == finals[0] and finals[2] == finals[0]
    [ep] = finals[0]
    assert (ep["broker_name"], ep["state"], ep["opened_ms"]) == ("broker-c", "closed", T0 + 65_000)
    if back_s is None:
        assert (ep["closed_ms"], ep["closed_by"], ep["cluster_brokers"]) == (T0 + 245_000, "silence", 2)
    else:
        assert (ep["closed_ms"], ep["closed_by"], ep["cluster_brokers"]) == (T0 + 195_000, "recovery", 3)


def test_the_sinks_decisions_are_the_same_from_memory_and_from_their_files(outage: Any, tmp_path: Any) -> None:
    """streaming.decisions keeps the state it saved last in memory: the rows are those of a sink
    that reads every batch's state back from its file, also from a file in the format before
    2026-11-26 (the clusters as a JSON text inside the document)."""
    import json

    import pyarrow.parquet as pq

    from pipeline.config import Config
    from pipeline.faults.points import POINT_SCHEMA
    from pipeline.ipc import ipc_bytes
    from streaming.decisions import CLOCK, POINTS, ClusterDecisions

    batches, per_batch = batches_of(outage, 5_000), []
    states: dict[str, Any] = {}
    previous, key_of = 0, by_shard(8)
    for events, settle in batches:
        keys = np.asarray([key_of(b) for b in events["broker_name"].tolist()], dtype=object)
        rows: list[dict] = []
        for key in sorted(set(keys.tolist())):
            states[key], out = step(states.get(key) or initial_state("DefaultCluster"), take(events, keys == key),
                                    previous, CFG, None, settle, points=True)
            rows += out.points.to_pylist() if out.points is not None else []
        extra = [(CLOCK, settle, b"")]
        if rows:
            extra.append((POINTS, len(rows), ipc_bytes(pa.Table.from_pylist(rows, schema=POINT_SCHEMA))))
        per_batch.append(extra)
        previous = settle

    def run(name: str, fresh: bool, old_format: bool) -> list[list[dict]]:
        cfg = Config().replace(storage__root=str(tmp_path / name / "tables"))
        folder = tmp_path / name / "ck"
        sink, written = ClusterDecisions(cfg, str(folder), "t"), []
        for batch_id, extra in enumerate(per_batch):
            if old_format and batch_id:
                path = sink.folder / f"{batch_id - 1}.json"
                doc = json.loads(path.read_text())
                path.write_text(json.dumps({"clusters": json.dumps(doc["clusters"]), "settle_ms": doc["settle_ms"]}))
            if fresh:
                sink = ClusterDecisions(cfg, str(folder), "t")
            files = sink(batch_id, extra)
            written.append(sorted((f.table, repr(pq.read_table(tmp_path / name / "tables" / f.table / f.path).to_pylist()))
                                  for f in files))
        return written

    memory = run("memory", False, False)
    assert any(memory)
    assert run("files", True, False) == memory
    assert run("old", True, True) == memory


def test_the_sinks_decisions_travel_to_the_write_tasks_without_their_state(tmp_path: Any) -> None:
    """Spark ships the sink's write function, which holds the decisions object, to every task."""
    import pickle

    from pipeline.config import Config
    from streaming.decisions import ClusterDecisions

    sink = ClusterDecisions(Config(), str(tmp_path), "t")
    sink._saved = (3, {"c1": ClusterState("c1", heads={"b": 1})}, 9)
    shipped = pickle.loads(pickle.dumps(sink))
    assert shipped._saved is None and shipped.folder == sink.folder and sink._saved[0] == 3
