"""What ``faultwatch lab`` prints: its facts, read from the tables the live job wrote, the avoidance
topic and the producers' own fault tables (snapshots taken by :mod:`faultwatch.lab`).

Live oracle tolerance (50 ms): the hook stamps an attempt's ``ts_ms`` in its after-call and the client
computes its avoid-until in ``updateFaultItem`` right after the hook returns, on the same JVM clock;
the client's value is the later one by the hook's own run time (well under a millisecond idle; 50 ms
covers a loaded two-core machine and a GC pause). Producers with the feed are left out of the oracle:
the feed writes their tables without a send, which no event shows.
"""

from __future__ import annotations

import json
import statistics
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from faultwatch.lab import LabRun, Snapshot

TOLERANCE_MS = 50
KILLED, FROZEN = "broker-b", "broker-c"


def _live(run: LabRun, table: str) -> list[dict[str, Any]]:
    from pipeline.deltaio import read_table, table_has_rows

    return read_table(run.storage_root, table).to_pylist() if table_has_rows(run.storage_root, table) else []


def client_windows(snap: Snapshot) -> dict[str, int]:
    """Broker -> avoid-until of the client's items still unavailable when it was read."""
    f = snap.faults
    return {i["broker_name"]: i["start_timestamp"] for i in f["items"] if i["start_timestamp"] > f["now_ms"]}


def oracle(run: LabRun, windows: list[dict[str, Any]], misses: list[str]) -> dict[str, tuple[int, int]]:
    """Per phase: (client items matched by a window revision of faultwatch's, client items); each
    unmatched item is described in ``misses``."""
    out: dict[str, tuple[int, int]] = {}
    for snap in run.snapshots:
        if not snap.fault_enable or snap.feed:
            continue
        now, cid = snap.faults["now_ms"], snap.faults["client_id"]
        mine = [w for w in windows if w["client_id"] == cid and w["state"] != "retracted" and w["start_ms"] <= now]
        matched, total = out.get(snap.phase, (0, 0))
        for broker, until in client_windows(snap).items():
            total += 1
            ends = sorted({w["end_ms"] for w in mine if w["broker_name"] == broker})
            hit = any(0 <= until - end <= TOLERANCE_MS for end in ends)
            matched += hit
            if not hit:
                misses.append(f"{snap.phase} {snap.producer} {broker}: client until {until} (read at {now}), "
                              f"faultwatch ends {ends[-5:]}")
        out[snap.phase] = (matched, total)
    return out


def first_attempt_failures(run: LabRun, sends: list[dict[str, Any]]) -> dict[str, int]:
    """Per fault-tolerant producer: first attempts that failed on the killed broker while it was down."""
    start, end = run.marks["kill"], run.marks["restarted"]
    by_client = {p.client_id: p.name for p in run.producers if p.fault_enable}
    counts = dict.fromkeys(by_client.values(), 0)
    for s in sends:
        if (s["broker_name"] == KILLED and s["attempt"] == 0 and s["status"] == "FAILED"
                and start <= s["ts_ms"] <= end and s["client_id"] in by_client):
            counts[by_client[s["client_id"]]] += 1
    return counts


def first_avoidance_ms(run: LabRun) -> int | None:
    """Kafka timestamp of the first ``rmq.avoidance`` record after the kill that avoids the killed broker."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=run.bootstrap, group_id=None, enable_auto_commit=False)
    try:
        parts = [TopicPartition(run.avoidance_topic, p) for p in consumer.partitions_for_topic(run.avoidance_topic) or ()]
        consumer.assign(parts)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(parts)
        first: int | None = None
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            for records in consumer.poll(timeout_ms=1000).values():
                for r in records:
                    avoid = {e["broker_name"] for e in json.loads(r.value).get("avoid", [])}
                    if KILLED in avoid and r.timestamp >= run.marks["kill"]:
                        first = r.timestamp if first is None else min(first, r.timestamp)
        return first
    finally:
        consumer.close()


def frozen_latency(run: LabRun, health: list[dict[str, Any]]) -> dict[str, float]:
    """Highest p99 latency per broker over the minutes that overlap the freeze."""
    lo, hi = run.marks["freeze"], run.marks["thaw"]
    out: dict[str, float] = {}
    for h in health:
        if h["minute_ms"] + 60_000 > lo and h["minute_ms"] <= hi:
            out[h["broker_name"]] = max(out.get(h["broker_name"], 0.0), float(h["latency_p99_ms"] or 0.0))
    return out


def report(run: LabRun) -> dict[str, Any]:
    from pipeline.deltaio import latest_revision

    windows = _live(run, "producer_fault_windows_live")
    sends = _live(run, "send_results")
    health = _live(run, "broker_health")
    episodes = _live(run, "broker_fault_episodes_live")
    lines: list[str] = []
    facts: dict[str, Any] = {}

    misses: list[str] = []
    per_phase = oracle(run, windows, misses)
    facts["oracle"] = {k: list(v) for k, v in per_phase.items()}
    for phase, (m, t) in per_phase.items():
        lines.append(f"live oracle, phase {phase}: {m}/{t} fault items matched within {TOLERANCE_MS} ms")
    lines.extend(f"  unmatched: {m}" for m in misses)

    kill, restart, restarted = run.marks["kill"], run.marks["restart"], run.marks["restarted"]
    import pyarrow as pa

    current = latest_revision(pa.Table.from_pylist(episodes), "episode_id").to_pylist() if episodes else []
    ep = sorted((e for e in current if e["broker_name"] == KILLED and e["opened_ms"] >= kill - 5000),
                key=lambda e: e["opened_ms"])
    if ep:
        e = ep[0]
        closed_s = None if e["closed_ms"] is None else (e["closed_ms"] - kill) / 1000
        facts["episode"] = {"opened_after_kill_s": (e["opened_ms"] - kill) / 1000, "closed_after_kill_s": closed_s,
                            "restart_began_s": (restart - kill) / 1000, "back_s": (restarted - kill) / 1000}
        closed = "still open" if closed_s is None else f"closed at {closed_s:.1f}s"
        lines.append(f"episode on {KILLED}: opened {(e['opened_ms'] - kill) / 1000:.1f}s after the kill, {closed} "
                     f"(its restart began at {(restart - kill) / 1000:.1f}s, it was back at {(restarted - kill) / 1000:.1f}s)")
    else:
        facts["episode"] = None
        lines.append(f"episode on {KILLED}: none opened")

    lat = frozen_latency(run, health)
    facts["freeze_p99_ms"] = lat
    lines.append("broker_health p99 latency (ms) in the freeze's minutes: "
                 + (", ".join(f"{b} {v:.0f}" for b, v in sorted(lat.items())) or "no minute settled yet"))
    frozen_windows = sorted({w["client_id"] for w in windows if w["broker_name"] == FROZEN
                             and run.marks["freeze"] <= w["start_ms"] <= run.marks["thaw"] + 5000})
    facts["freeze_windows"] = len(frozen_windows)
    lines.append(f"producers with a window on {FROZEN} opened during the freeze: {len(frozen_windows)}")

    failures = first_attempt_failures(run, sends)
    feed = sum(n for name, n in failures.items() if "-feed" in name)
    plain = sum(n for name, n in failures.items() if "-feed" not in name)
    facts["first_attempt_failures"] = {"with_feed": feed, "without_feed": plain, "per_producer": failures}
    fewer = f"{100 * (1 - feed / plain):.0f}% fewer" if plain else "no failures without the feed"
    lines.append(f"first-attempt failures on {KILLED} while down: with the feed {feed}, without {plain} ({fewer}; "
                 f"per producer {failures})")

    first = first_avoidance_ms(run)
    applied = [s["first_applied_by_broker"][KILLED] - kill for s in run.feed_stats.values()
               if s["first_applied_by_broker"].get(KILLED, 0) >= kill]
    facts["kill_to_avoidance_s"] = None if first is None else (first - kill) / 1000
    facts["kill_to_applied_p50_s"] = statistics.median(applied) / 1000 if applied else None
    lines.append(f"kill -> first avoidance record naming {KILLED} on {run.avoidance_topic}: "
                 + ("none" if first is None else f"{(first - kill) / 1000:.1f}s")
                 + f"; -> feed producers writing {KILLED} into their tables: "
                 + (f"p50 {statistics.median(applied) / 1000:.1f}s over {len(applied)} feed producers" if applied else "none"))
    return {"lines": lines, "facts": facts}
