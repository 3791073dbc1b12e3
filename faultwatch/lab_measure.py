"""What ``faultwatch lab`` prints: its facts, read from the tables the live job wrote, the avoidance
topic and the producers' own fault tables (snapshots and samples taken by :mod:`faultwatch.lab`).

Live oracle, exact (tolerance 0 ms): the send hook is installed with its client-latency tap, so each
event of a fault-tolerant producer carries the latency the client charged the attempt with and the
client's own clock reading in ``updateFaultItem``; faultwatch's window end (timestamp + duration) is
then the client's avoid-until to the millisecond. The comparison runs both ways: every client item in
force at the snapshot has a faultwatch window in force then (as known at that moment) with the same
end, and every such window has its client item. Producers with the feed are left out: the feed
writes their tables without a send, which no event shows. The table keeps a window's state after
each micro-batch, so a state that one micro-batch opened and changed again is not there to compare:
such items (a send in between shows them) are counted apart, never as matches. An item a 4.9
client removed by itself (its fallback drops a picked broker that left the route) is compared like
any other: the hook's next event carries the removal, and faultwatch ends the window there; the
facts count such removals (``client_removals``).

Release: from the killed broker's restart on, the avoidance each fault-tolerant producer's own table
still held on it, in broker-minutes: between two readings the earlier one's state (cut at its
avoid-until), after the last one the avoid-until it still holds (the client's own commitment; a
4.9 window of 10 minutes is not waited out).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from itertools import pairwise
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from faultwatch.lab import LabRun, Snapshot

TOLERANCE_MS = 0
KILLED, FROZEN = "broker-b", "broker-c"


def _live(run: LabRun, table: str) -> list[dict[str, Any]]:
    from pipeline.deltaio import read_table, table_has_rows

    return read_table(run.storage_root, table).to_pylist() if table_has_rows(run.storage_root, table) else []


def client_windows(snap: Snapshot) -> dict[str, int]:
    """Broker -> avoid-until of the client's items still unavailable when it was read."""
    f = snap.faults
    return {i["broker_name"]: i["start_timestamp"] for i in f["items"] if i["start_timestamp"] > f["now_ms"]}


Revisions = dict[str, list[dict[str, Any]]]


def revisions_by_client(windows: list[dict[str, Any]]) -> dict[str, Revisions]:
    """client_id -> window_id -> its revisions in order; windows retracted in the end are left out."""
    out: dict[str, Revisions] = defaultdict(lambda: defaultdict(list))
    for w in windows:
        out[w["client_id"]][w["window_id"]].append(w)
    for by_id in out.values():
        for wid in list(by_id):
            by_id[wid].sort(key=lambda r: r["revision"])
            if by_id[wid][-1]["state"] == "retracted":
                del by_id[wid]
    return out


def faultwatch_windows_at(by_id: Revisions, now: int) -> dict[str, int]:
    """Broker -> end of the windows in force at ``now``, each window as it stood then: its newest
    revision whose change (``updated_ms``) is not later (the first one when a micro-batch folded the
    opening update together with a later one)."""
    out: dict[str, int] = {}
    for rows in by_id.values():
        w = ([r for r in rows if r["updated_ms"] <= now] or rows[:1])[-1]
        if w["start_ms"] <= now < w["end_ms"]:
            out[w["broker_name"]] = max(out.get(w["broker_name"], 0), w["end_ms"])
    return out


def client_removals(run: LabRun) -> dict[str, int]:
    """Per producer: the fault items its client removed by itself, as its hook last reported them."""
    out: dict[str, int] = {}
    for snap in run.snapshots:
        out[snap.producer] = max(out.get(snap.producer, 0), len(snap.faults.get("removed", ())))
    return {p: n for p, n in sorted(out.items()) if n}


def folded_over_a_send(by_id: Revisions, now: int, send_times: dict[str, list[int]]) -> set[str]:
    """Brokers whose window as it stood at ``now`` is not in the table: its first revision was written
    after ``now`` and a send to that broker came in between, so one micro-batch folded the state of
    ``now`` together with a later change (a short window cut by a later success, say)."""
    out = set()
    for rows in by_id.values():
        first = rows[0]
        if first["start_ms"] <= now < first["updated_ms"] and any(
                now < t <= first["updated_ms"] for t in send_times.get(first["broker_name"], ())):
            out.add(first["broker_name"])
    return out


def oracle(run: LabRun, windows: list[dict[str, Any]], misses: list[str],
           by_version: dict[str, list[int]] | None = None,
           sends: list[dict[str, Any]] | None = None, folded: list[str] | None = None) -> dict[str, tuple[int, int]]:
    """Per phase: (items matched, items): an item is a broker that the client's table or faultwatch's
    windows (as known then) hold in force at the snapshot; it matches when both do, with the same
    avoid-until. Each miss is described in ``misses``; ``by_version`` gets the counts per client line.
    With ``sends``, a broker whose window as of the snapshot one micro-batch folded into a later change
    (:func:`folded_over_a_send`) is no item: it is described in ``folded`` instead."""
    revisions = revisions_by_client(windows)
    send_times: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for s in sends or ():
        send_times[s["client_id"]][s["broker_name"]].append(s["ts_ms"])
    out: dict[str, tuple[int, int]] = {}
    for snap in run.snapshots:
        if not snap.fault_enable or snap.feed:
            continue
        now = snap.faults["now_ms"]
        client = client_windows(snap)
        mine = revisions.get(snap.faults["client_id"], {})
        ours = faultwatch_windows_at(mine, now)
        unknown = folded_over_a_send(mine, now, send_times[snap.faults["client_id"]]) if sends is not None else set()
        matched = total = 0
        for broker in sorted(client.keys() | ours.keys()):
            if broker in unknown:
                if folded is not None:
                    folded.append(f"{snap.phase} {snap.producer} {broker}: client until {client.get(broker)}, "
                                  f"faultwatch's first row of the window written later (read at {now})")
                continue
            until, end = client.get(broker), ours.get(broker)
            hit = until is not None and end is not None and abs(until - end) <= TOLERANCE_MS
            total += 1
            matched += hit
            if not hit:
                misses.append(f"{snap.phase} {snap.producer} {broker}: client until {until}, faultwatch end {end} "
                              f"(read at {now})")
        m, t = out.get(snap.phase, (0, 0))
        out[snap.phase] = (m + matched, t + total)
        if by_version is not None:
            line = by_version.setdefault(snap.version, [0, 0])
            line[0] += matched
            line[1] += total
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


def first_send_back_ms(run: LabRun, sends: list[dict[str, Any]]) -> int | None:
    """Event time of the first send to the killed broker that succeeded after its restart began: the
    producers learn it is back from the name server's routes, refreshed every 30 s."""
    return min((s["ts_ms"] for s in sends if s["broker_name"] == KILLED and s["status"] == "SEND_OK"
                and s["ts_ms"] >= run.marks["restart"]), default=None)


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


def avoided_ms(samples: list[tuple[int, int]]) -> int:
    """Milliseconds a producer's table held the broker unavailable over ``(now, avoid-until)`` readings."""
    pts = sorted(samples)
    total = sum(min(u, t2) - t for (t, u), (t2, _) in pairwise(pts) if u > t)
    if pts and pts[-1][1] > pts[-1][0]:
        total += pts[-1][1] - pts[-1][0]
    return total


def released_at(samples: list[tuple[int, int]]) -> int | None:
    """The first reading after the last one that showed the broker unavailable (None: still avoided)."""
    pts = sorted(samples)
    last_avoiding = max((i for i, (t, u) in enumerate(pts) if u > t), default=-1)
    return pts[last_avoiding + 1][0] if last_avoiding + 1 < len(pts) else None


def release(run: LabRun, sends: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Broker-minutes of avoidance of the killed broker after its restart, per producer and per client
    line with and without the feed; when the feed's producers let it go, after the episode closed.
    With ``sends``: when each producer's own first send to it succeeded after the restart began and
    when its table first showed it available, seconds after it was back (a 4.9 client's success
    ends its window by itself: under load, when its other brokers are slow too, it tries the
    killed one again long before a 10-minute window ends)."""
    since = run.marks["restarted"]
    by_name: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for name, now, until in run.release_samples:
        if now >= since:
            by_name[name].append((now, until))
    per: dict[str, float] = {}
    lines: dict[str, dict[str, float]] = {}
    released: dict[str, float | None] = {}
    for p in run.producers:
        if not p.fault_enable:
            continue
        minutes = round(avoided_ms(by_name[p.name]) / 60_000, 3)
        per[p.name] = minutes
        line = lines.setdefault(p.version, {"with_feed": 0.0, "without_feed": 0.0})
        line["with_feed" if p.feed else "without_feed"] += minutes
        at = released_at(by_name[p.name])
        released[p.name] = None if at is None else round((at - run.marks["episode_closed"]) / 1000, 1)
    out: dict[str, Any] = {"broker_minutes": lines, "per_producer": per, "released_after_close_s": released,
                           "samples": {n: len(v) for n, v in by_name.items()}}
    if sends is not None:
        names = {p.client_id: p.name for p in run.producers if p.fault_enable}
        own: dict[str, int] = {}
        for s in sends:
            who = names.get(s["client_id"])
            if (who is not None and s["broker_name"] == KILLED and s["status"] == "SEND_OK"
                    and s["ts_ms"] >= run.marks["restart"]):
                own[who] = min(own.get(who, s["ts_ms"]), s["ts_ms"])
        out["own_send_back_s"] = {n: None if n not in own else round((own[n] - since) / 1000, 1) for n in per}
        out["released_s"] = {n: None if (at := released_at(by_name[n])) is None else round((at - since) / 1000, 1)
                             for n in per}
    return out


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
    by_version: dict[str, list[int]] = {}
    folded: list[str] = []
    per_phase = oracle(run, windows, misses, by_version, sends, folded)
    facts["oracle"] = {k: list(v) for k, v in per_phase.items()}
    facts["oracle_by_version"] = by_version
    for phase, (m, t) in per_phase.items():
        lines.append(f"live oracle, phase {phase}: {m}/{t} fault items matched (ends equal within {TOLERANCE_MS} ms)")
    lines.append("live oracle per client line, all phases: "
                 + ", ".join(f"{v} {m}/{t}" for v, (m, t) in sorted(by_version.items())))
    lines.extend(f"  unmatched: {m}" for m in misses[:40])
    facts["oracle_folded"] = len(folded)
    if folded:
        lines.append(f"  not compared ({len(folded)}): the window's state at the reading was folded by one "
                     "micro-batch into a later change")
        lines.extend(f"  folded: {m}" for m in folded[:10])
    facts["client_removals"] = client_removals(run)
    if facts["client_removals"]:
        lines.append("  fault items the clients removed by themselves (4.9's fallback; compared like the others): "
                     f"{facts['client_removals']}")
    if len(misses) > 40:
        lines.append(f"  ... and {len(misses) - 40} more unmatched")

    kill, restart, restarted = run.marks["kill"], run.marks["restart"], run.marks["restarted"]
    import pyarrow as pa

    current = latest_revision(pa.Table.from_pylist(episodes), "episode_id").to_pylist() if episodes else []
    ep = sorted((e for e in current if e["broker_name"] == KILLED and e["opened_ms"] >= kill - 5000),
                key=lambda e: e["opened_ms"])
    if ep:
        e = ep[0]
        closed_s = None if e["closed_ms"] is None else (e["closed_ms"] - kill) / 1000
        first_ok = first_send_back_ms(run, sends)
        sent_s = None if first_ok is None else (first_ok - kill) / 1000
        facts["episode"] = {"opened_after_kill_s": (e["opened_ms"] - kill) / 1000, "closed_after_kill_s": closed_s,
                            "closed_by": e["closed_by"], "restart_began_s": (restart - kill) / 1000,
                            "back_s": (restarted - kill) / 1000, "first_send_back_s": sent_s}
        closed = "still open" if closed_s is None else f"closed at {closed_s:.1f}s by {e['closed_by']}"
        sent = "no send succeeded on it afterwards" if sent_s is None else f"its first send succeeded at {sent_s:.1f}s"
        lines.append(f"episode on {KILLED}: opened {(e['opened_ms'] - kill) / 1000:.1f}s after the kill, {closed} "
                     f"(its restart began at {(restart - kill) / 1000:.1f}s, it was back at {(restarted - kill) / 1000:.1f}s, "
                     f"{sent})")
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

    from faultwatch.lab import LATE_S

    failures = first_attempt_failures(run, sends)
    late = {p.name for p in run.producers if p.late}
    for key, group, who in (("first_attempt_failures", "busy producers", False),
                            ("first_attempt_failures_late", f"late producers (idle until {LATE_S:.0f}s after the kill)",
                             True)):
        mine = {name: n for name, n in failures.items() if (name in late) == who}
        feed = sum(n for name, n in mine.items() if "-feed" in name)
        plain = sum(n for name, n in mine.items() if "-feed" not in name)
        facts[key] = {"with_feed": feed, "without_feed": plain, "per_producer": mine}
        fewer = f"{100 * (1 - feed / plain):.0f}% fewer" if plain else "no failures without the feed"
        lines.append(f"first-attempt failures on {KILLED} while down, {group}: with the feed {feed}, without {plain} "
                     f"({fewer}; per producer {mine})")

    rel = release(run, sends)
    facts["release"] = rel
    for version, m in sorted(rel["broker_minutes"].items()):
        lines.append(f"release ({version}): broker-minutes of avoidance of {KILLED} after it was back: with the feed "
                     f"{m['with_feed']:.2f}, without {m['without_feed']:.2f}")
    lines.append(f"  per producer {rel['per_producer']}; readings after the restart {rel['samples']}; "
                 f"tables showing {KILLED} available again, seconds after its episode closed: {rel['released_after_close_s']}")
    lines.append(f"  seconds after it was back: each producer's own first send to it that succeeded "
                 f"{rel['own_send_back_s']}, its table showing it available {rel['released_s']}")
    facts["load_average"] = run.load_average
    lines.append(f"load average (1 min) at the start and the end: {run.load_average}")

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
