"""Does the faultwatch feed cut send failures? Measured on the simulator's broker-outage scenario.

Twenty producers of one client version send to four brokers; broker-b refuses connections from
30 s to 90 s. Three runs per version, same seed:

  (a) off         sendLatencyFaultEnable=false (RocketMQ's default)
  (b) local       RocketMQ's local latency fault tolerance only
  (c) local+feed  (b) plus the faultwatch feed: every ``--cycle-s`` of simulated time the publisher
                  decides from what the pipeline has seen (``--lag-s`` behind), validates with the GX
                  gate, encodes the wire format, and the producers' ``FeedAwareSelector`` applies it

Counted: first-attempt send failures (attempt 0 failed) and final failures (every attempt of a
message failed), over the whole run and from the first published cycle on. Goal: (c) cuts
first-attempt failures by >= 80% against (b) from the first published cycle on.

The silver tables the publisher reads are stood in for here, in memory: producer windows are the
simulated clients' own avoidance windows (what ``producer_fault_windows`` holds, proven equal by the
simulator's tests), broker health is per-minute sends and failures, and episodes use the quorum rule
of ``[faults]`` (quorum_share of recently active producers avoiding, at least quorum_min_producers,
kept open episode_close_after_s after the quorum is lost) or the failure-rate outlier rule. Replace
:func:`episodes_at` by the streaming job's pure detector once it exists in ``pipeline/``.

Run: ``.venv/bin/python bench/effectiveness.py [--versions 5.3.3] [--outage-s 60]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.config import Config
from pipeline.policy import (
    AVOID,
    Avoiding,
    Decision,
    Episode,
    Health,
    PreviousEntry,
    PreviousState,
    Snapshot,
    decide,
)
from pipeline.producer import FeedAwareSelector, FeedState, apply_message, avoided_brokers
from pipeline.publish.wire import encode, messages
from pipeline.simulate import Simulation, load_scenario
from pipeline.simulate.producers import TracedSelector
from pipeline.simulate.scenario import FaultSpec, ProducerSpec, Scenario

S = 1000
MODES = ("off", "local", "local+feed")
# SendResult row positions (pipeline/simulate/producers.py builds rows in SendResult field order).
TS, CLIENT, BROKER, STATUS, LATENCY, ATTEMPT = 1, 4, 7, 9, 10, 13


class FedTracedSelector(TracedSelector, FeedAwareSelector):
    """The simulator's traced selector with the feed plugged in (select → feed overlay → RocketMQ)."""


def bench_scenario(version: str, fault_tolerance: bool, producers: int, outage_s: float) -> Scenario:
    base = load_scenario("broker-outage")
    spec = ProducerSpec(group="PG_bench", count=producers, topic="TopicPay", client_version=version,
                        fault_tolerance=fault_tolerance, rate_per_s=40.0)
    faults = tuple(FaultSpec(f.broker, f.kind, f.start_s, outage_s, mode=f.mode) for f in base.faults)
    return base.replace(producers=(spec,), consumers=(), faults=faults,
                        duration_s=max(base.duration_s, faults[0].start_s + outage_s + 60))


@dataclass
class Second:
    """Sends seen in one second of event time: who sent, and per broker sends and failures."""

    clients: set[str] = field(default_factory=set)
    sends: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    failures: dict[str, int] = field(default_factory=lambda: defaultdict(int))


@dataclass
class Pipeline:
    """What the streaming job would have written by now, kept incrementally from the event rows."""

    cfg: Config
    lag_ms: int
    seconds: dict[int, Second] = field(default_factory=lambda: defaultdict(Second))
    # per broker: [opened_ms, closed_ms | None, last_bad_ms, peak_avoiding, active]
    episodes: dict[str, list[list[Any]]] = field(default_factory=lambda: defaultdict(list))
    sampled_ms: int | None = None

    def add(self, rows: list[list[Any]]) -> None:
        for r in rows:
            sec = self.seconds[r[TS] // S]
            sec.clients.add(r[CLIENT])
            sec.sends[r[BROKER]] += 1
            if r[STATUS] == "FAILED":
                sec.failures[r[BROKER]] += 1

    def totals(self, broker: str, from_ms: int, to_ms: int) -> tuple[int, int, set[str]]:
        """Sends and failures to ``broker`` and the active clients, in seconds ``[from, to]``."""
        sends = failures = 0
        clients: set[str] = set()
        for s in range(from_ms // S, to_ms // S + 1):
            sec = self.seconds.get(s)
            if sec is not None:
                sends += sec.sends.get(broker, 0)
                failures += sec.failures.get(broker, 0)
                clients |= sec.clients
        return sends, failures, clients

    def bad_at(self, windows: list[Any], broker: str, t: int) -> tuple[bool, int, int]:
        """The quorum or failure-rate outlier rule of ``[faults]`` at ``t``."""
        f = self.cfg.faults
        sends, failures, active = self.totals(broker, t - int(f.active_producer_window_s * S), t)
        avoiding = {w.client_id for w in windows if w.broker_name == broker and w.start_ms <= t < w.end_ms}
        quorum = len(avoiding) >= f.quorum_min_producers and len(avoiding) >= f.quorum_share * max(1, len(active))
        outlier = sends >= f.outlier_min_sends and failures / sends >= f.outlier_failure_rate
        return quorum or outlier, len(avoiding), len(active)

    def episodes_at(self, sim: Simulation, brokers: list[str], t: int, cluster: str) -> list[Episode]:
        """The episodes as of ``t``, the rules sampled every second since the previous call."""
        windows = sim.client_windows()
        close_after = int(self.cfg.faults.episode_close_after_s * S)
        start = sim.epoch_ms if self.sampled_ms is None else self.sampled_ms + S
        out = []
        for broker in brokers:
            eps = self.episodes[broker]
            for s in range(start, t + 1, S):
                bad, avoiding, active = self.bad_at(windows, broker, s)
                if bad and (not eps or eps[-1][1] is not None):
                    eps.append([s, None, s, avoiding, active])
                elif bad:
                    eps[-1][2:] = [s, max(avoiding, eps[-1][3]), active]
                elif eps and eps[-1][1] is None and s - eps[-1][2] >= close_after:
                    eps[-1][1] = s
            out += [self._episode(cluster, broker, e, t) for e in eps]
        self.sampled_ms = t
        return out

    def _episode(self, cluster: str, broker: str, e: list[Any], t: int) -> Episode:
        opened, closed, last_bad, peak, active = e
        sends, failures, _ = self.totals(broker, opened, closed or t)
        return Episode(f"{cluster}|{broker}|{opened}", cluster, broker, opened, closed,
                       "open" if closed is None else "closed", "quorum", peak, active, sends, failures,
                       3000.0, closed or last_bad)

    def health_at(self, brokers: list[str], t: int, cluster: str) -> list[Health]:
        """The last complete minute before ``t``, per broker (p99 is not modelled here: 0)."""
        minute = (t // 60_000 - 1) * 60_000
        out = []
        for broker in brokers:
            n, bad, clients = self.totals(broker, minute, minute + 60_000 - 1)
            out.append(Health(cluster, broker, minute, n, bad, bad / n if n else 0.0, 0.0, len(clients), 0))
        return out


def publisher_cycle(
    pipe: Pipeline, sim: Simulation, t: int, previous: PreviousState, cfg: Config, gate: bool
) -> tuple[Decision, bool]:
    """One cycle at simulated time ``t`` over what the pipeline knew at ``t - lag``."""
    seen = t - pipe.lag_ms
    cluster = sim.producers[0].cluster
    brokers = sorted(sim.model.names)
    eps = pipe.episodes_at(sim, brokers, seen, cluster)
    avoiding = defaultdict(set)
    for w in sim.client_windows():
        if w.start_ms <= seen < w.end_ms:
            avoiding[w.broker_name].add(w.client_id)
    snapshot = Snapshot(t, tuple(eps), tuple(pipe.health_at(brokers, seen, cluster)),
                        tuple(Avoiding(cluster, b, len(c)) for b, c in sorted(avoiding.items())), seen)
    decision = decide(snapshot, previous, t, cfg.policy)
    ok = True
    if gate:
        from pipeline.publish.gate import run_gate

        ok = run_gate(snapshot, decision, cfg.policy).success
    return decision, ok


@dataclass
class Counts:
    first_attempt_failures: int = 0
    final_failures: int = 0
    messages: int = 0
    first_after: int = 0
    final_after: int = 0
    messages_after: int = 0
    first_published_ms: int | None = None


def count(rows_by_client: dict[str, list[tuple[int, int, bool]]], cut: int) -> Counts:
    """Messages start at attempt 0; a final failure is a message whose every attempt failed."""
    c = Counts()
    for rows in rows_by_client.values():
        rows.sort()
        msg_start, all_failed = None, True
        for ts, attempt, failed in rows + [(None, 0, False)]:
            if attempt == 0:
                if msg_start is not None and all_failed:
                    c.final_failures += 1
                    c.final_after += msg_start >= cut
                if ts is None:
                    break
                msg_start, all_failed = ts, True
                c.messages += 1
                c.messages_after += ts >= cut
                if failed:
                    c.first_attempt_failures += 1
                    c.first_after += ts >= cut
            all_failed = all_failed and failed
    return c


def run(version: str, mode: str, args: argparse.Namespace, cfg: Config) -> Counts:
    sim = Simulation(bench_scenario(version, mode != "off", args.producers, args.outage_s))
    holder = {"state": FeedState()}
    if mode == "local+feed":
        for p in sim.producers:
            old = p.selector
            new = FedTracedSelector(
                old.generation, fault_enabled=old.fault_enabled, detector_enabled=old.detector_enabled,
                retry_another_broker_when_not_store_ok=old.retry_another_broker_when_not_store_ok, seed=old.seed,
                avoid=lambda now, c=p.cluster: avoided_brokers(holder["state"], c, now),
            )
            new.trace = old.trace
            p.selector = new
    pipe = Pipeline(cfg, int(args.lag_s * S))
    cycle_ms = int(args.cycle_s * S)
    next_cycle = sim.epoch_ms + cycle_ms
    previous = PreviousState()
    first_published: int | None = None
    per_client: dict[str, list[tuple[int, int, bool]]] = defaultdict(list)
    for batch in sim.batches():
        for r in batch.send_result:
            per_client[r[CLIENT]].append((r[TS], r[ATTEMPT], r[STATUS] == "FAILED"))
        pipe.add(batch.send_result)
        if mode == "local+feed" and batch.end_ms >= next_cycle and not sim.done:
            decision, ok = publisher_cycle(pipe, sim, next_cycle, previous, cfg, gate=args.gate)
            if ok:
                for _, m in messages(decision, str(next_cycle // cycle_ms)):
                    holder["state"] = apply_message(holder["state"], encode(m))
                previous = PreviousState(str(next_cycle // cycle_ms), decision.decided_ms, tuple(
                    PreviousEntry(r.cluster, r.broker_name, r.action, r.avoid_until_ms, r.decided_ms, r.reason)
                    for r in decision.recommendations()))
                if first_published is None:
                    first_published = next_cycle
                if args.verbose:
                    print(f"    cycle at {(next_cycle - sim.epoch_ms) / S:.0f}s: avoid "
                          f"{[(r.broker_name, (r.avoid_until_ms - sim.epoch_ms) / S) for r in decision.recommendations() if r.action == AVOID]}")
            next_cycle += cycle_ms
    cut = first_published if first_published is not None else sim.epoch_ms + cycle_ms
    out = count(per_client, cut)
    out.first_published_ms = None if first_published is None else first_published - sim.epoch_ms
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--versions", nargs="+", default=["4.9.8", "5.3.3"])
    p.add_argument("--producers", type=int, default=20)
    p.add_argument("--outage-s", type=float, default=60.0, help="broker-b outage length (scenario: 60)")
    p.add_argument("--cycle-s", type=float, default=60.0, help="publisher interval in simulated time")
    p.add_argument("--lag-s", type=float, default=10.0, help="how far behind the pipeline's tables are")
    p.add_argument("--no-gate", dest="gate", action="store_false", help="skip the GX gate (faster)")
    p.add_argument("--policy", nargs="*", default=[], metavar="KEY=VALUE",
                   help="override [policy] keys, e.g. base_avoid_s=60 hysteresis_s=100")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    cfg = Config().replace(**{f"policy__{k}": float(v) for k, v in (kv.split("=", 1) for kv in args.policy)})
    print(f"broker-outage: {args.producers} producers, broker-b down {args.outage_s:.0f}s from 30s; "
          f"publisher every {args.cycle_s:.0f}s (simulated), tables {args.lag_s:.0f}s behind")
    goal_met = True
    for version in args.versions:
        print(f"\nclient {version}")
        print(f"  {'mode':<11} {'messages':>9} {'1st-attempt fail':>17} {'final fail':>11} | "
              f"{'from cycle: 1st-attempt':>24} {'final':>6}")
        results = {}
        for mode in MODES:
            t0 = time.perf_counter()
            c = results[mode] = run(version, mode, args, cfg)
            print(f"  {mode:<11} {c.messages:>9} {c.first_attempt_failures:>17} {c.final_failures:>11} | "
                  f"{c.first_after:>24} {c.final_after:>6}   ({time.perf_counter() - t0:.1f}s)")
        b, c = results["local"], results["local+feed"]
        if c.first_published_ms is None:
            print("  no cycle published an avoidance: goal not met")
            goal_met = False
        elif b.first_after == 0:
            print(f"  first published cycle at {c.first_published_ms / S:.0f}s; (b) has no first-attempt failures "
                  f"left to cut after it ((c): {c.first_after}): ratio n/a")
            goal_met = goal_met and c.first_after == 0
        else:
            cut = 1 - c.first_after / b.first_after
            print(f"  first published cycle at {c.first_published_ms / S:.0f}s; (c) vs (b) first-attempt failures "
                  f"from then on: {c.first_after} vs {b.first_after} = {cut:.1%} fewer (goal >= 80%: "
                  f"{'met' if cut >= 0.8 else 'NOT met'})")
            goal_met = goal_met and cut >= 0.8
    print(f"\ngoal {'met' if goal_met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
