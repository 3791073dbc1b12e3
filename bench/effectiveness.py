"""Does the faultwatch feed cut send failures? Measured on the simulator's broker-outage scenario.

Twenty producers of one client version send to four brokers; broker-b refuses connections from
30 s to 90 s. Three runs per version, same seed: (a) ``off`` (sendLatencyFaultEnable=false,
RocketMQ's default); (b) ``local`` (RocketMQ's local latency fault tolerance only); (c)
``local+feed``: (b) plus the feed, where every ``--cycle-s`` of simulated time the publisher decides
from what the streaming job has written by then, validates with the GX gate, and the producers'
``FeedAwareSelector`` applies the list. Counted: first-attempt and final send failures, over the run
and from the first published cycle on. Goal: (c) cuts first-attempt failures by >= 80 % against (b).

Nothing is stood in for: the job's reads lag the cycle by ``--lag-s`` and run the real fault step
(:func:`pipeline.faults.fleet_step`) with the job's watermark delay; the publisher reduces the rows
as it reduces the Delta tables (:func:`pipeline.policy.inputs.build_snapshot`) and runs the real
``recommend`` and ``validate``. How early the feed can act is therefore set by the pipeline (a
suspected episode is acted on at once), not by this script.

Run: ``.venv/bin/python bench/effectiveness.py [--versions 5.3.3] [--outage-s 60]``.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.config import Config
from pipeline.faults import FleetState, fleet_step, from_send_results
from pipeline.policy import AVOID, Decision, PreviousState
from pipeline.policy.inputs import build_snapshot, previous_state
from pipeline.producer import FeedAwareSelector, FeedState, apply_message, avoided_brokers
from pipeline.publish.cycle import AVOIDANCE_STEP, CycleInput, cycle_row, history_rows, recommend, validate
from pipeline.publish.gate import GateResult
from pipeline.publish.wire import encode, messages
from pipeline.simulate import Simulation, load_scenario
from pipeline.simulate.producers import TracedSelector
from pipeline.simulate.scenario import FaultSpec, ProducerSpec, Scenario
from schemas.events import SendResult
from schemas.tables import table

S = 1000
MODES = ("off", "local", "local+feed")
# SendResult row positions (pipeline/simulate/producers.py builds rows in SendResult field order).
TS, CLIENT, BROKER, STATUS, LATENCY, ATTEMPT = 1, 4, 7, 9, 10, 13
FAULT_TABLES = {"windows": "producer_fault_windows_live", "episodes": "broker_fault_episodes_live",
                "health": "broker_health"}


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
class Pipeline:
    """The streaming job's fault step over the simulated Kafka topic, and the rows it has appended."""

    cfg: Config
    lag_ms: int
    partitions: int = 4
    fleet: FleetState = field(default_factory=FleetState)
    unread: list[list[Any]] = field(default_factory=list)  # send-result rows in Kafka, not read yet
    offsets: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    appended: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {k: [] for k in FAULT_TABLES})
    steps: int = 0

    def add(self, rows: list[list[Any]]) -> None:
        """Rows the producers' hooks wrote (in write order)."""
        self.unread += rows

    def catch_up(self, t: int) -> None:
        """Run the fault step over every event stamped up to ``t - lag`` not read yet, one micro-batch
        per ``stream.trigger_interval_s`` of event time, each with its Kafka coordinates."""
        seen = t - self.lag_ms
        now, later = [r for r in self.unread if r[TS] <= seen], [r for r in self.unread if r[TS] > seen]
        self.unread = later
        trigger = int(self.cfg.stream.trigger_interval_s * S)
        delay = int(self.cfg.stream.watermark_delay_s * S)
        by_batch: dict[int, list[list[Any]]] = defaultdict(list)
        for r in now:
            by_batch[r[TS] // trigger].append(r)
        for k in sorted(by_batch):
            rows = by_batch[k]
            parts = [zlib.crc32(r[BROKER].encode()) % self.partitions for r in rows]
            offs = []
            for p in parts:
                offs.append(self.offsets[p])
                self.offsets[p] += 1
            events = from_send_results([SendResult(*r) for r in rows], partitions=parts, offsets=offs)
            read_at = (k + 1) * trigger + self.lag_ms  # when the job got to this batch
            self.fleet, out = fleet_step(self.fleet, events, self.cfg.faults, delay, read_at)
            for key in FAULT_TABLES:
                self.appended[key] += getattr(out, key)
            self.steps += 1

    def tables(self) -> dict[str, pa.Table]:
        """Every row appended so far, per table, with the Delta table's schema."""
        return {key: pa.Table.from_pylist(self.appended[key], schema=table(name).arrow_schema())
                for key, name in FAULT_TABLES.items()}


@dataclass
class Publisher:
    """The publisher's cycle over the pipeline's tables, and what it has appended itself."""

    cfg: Config
    gate: bool
    history: list[dict[str, Any]] = field(default_factory=list)
    cycles: list[dict[str, Any]] = field(default_factory=list)

    def previous(self) -> PreviousState:
        return previous_state(
            pa.Table.from_pylist(self.history, schema=table("avoidance_recommendations").arrow_schema()),
            pa.Table.from_pylist(self.cycles, schema=table("publisher_cycles").arrow_schema()),
        )

    def cycle(self, pipe: Pipeline, t: int, number: int) -> tuple[CycleInput, Decision, bool]:
        """One cycle at simulated time ``t``: load, recommend, validate; record it when it passes."""
        pipe.catch_up(t)
        tabs = pipe.tables()
        snapshot = build_snapshot(tabs["episodes"], tabs["health"], tabs["windows"], t)
        inp = CycleInput(number, t, snapshot, self.previous())
        decision = recommend(inp, self.cfg)
        ok = validate(inp, decision, self.cfg).success if self.gate else GateResult(True).success
        if ok:
            self.history += history_rows(decision, inp.cycle_id)
            self.cycles.append(cycle_row(self.cfg, inp, decision, AVOIDANCE_STEP, "published"))
        return inp, decision, ok


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
            assert isinstance(old, TracedSelector)  # fault tolerance is on in this mode
            new = FedTracedSelector(
                old.generation, fault_enabled=old.fault_enabled, detector_enabled=old.detector_enabled,
                retry_another_broker_when_not_store_ok=old.retry_another_broker_when_not_store_ok, seed=old.seed,
                avoid=lambda now, c=p.cluster: avoided_brokers(holder["state"], c, now),  # type: ignore[misc]  # mypy cannot infer a lambda with a default argument
            )
            new.trace = old.trace
            p.selector = new
    pipe = Pipeline(cfg, int(args.lag_s * S), partitions=cfg.kafka.partitions)
    publisher = Publisher(cfg, args.gate)
    cycle_ms = int(args.cycle_s * S)
    next_cycle = sim.epoch_ms + cycle_ms
    first_published: int | None = None
    per_client: dict[str, list[tuple[int, int, bool]]] = defaultdict(list)
    for batch in sim.batches():
        for r in batch.send_result:
            per_client[r[CLIENT]].append((r[TS], r[ATTEMPT], r[STATUS] == "FAILED"))
        if mode != "local+feed":
            continue
        pipe.add(batch.send_result)
        if batch.end_ms >= next_cycle and not sim.done:
            inp, decision, ok = publisher.cycle(pipe, next_cycle, next_cycle // cycle_ms)
            if ok:
                for _, m in messages(decision, inp.cycle_id):
                    holder["state"] = apply_message(holder["state"], encode(m))
                if first_published is None:
                    first_published = next_cycle
            if args.verbose:
                snap = inp.snapshot
                print(f"    cycle at {(next_cycle - sim.epoch_ms) / S:.0f}s "
                      f"({'published' if ok else 'rejected'}): tables up to "
                      f"{(snap.freshest_ms - sim.epoch_ms) / S if snap.freshest_ms else float('nan'):.0f}s, "
                      f"episodes {[(e.broker_name, e.state, (e.opened_ms - sim.epoch_ms) / S) for e in snap.episodes]}, "
                      f"avoid {[(r.broker_name, (r.avoid_until_ms - sim.epoch_ms) / S) for r in decision.recommendations() if r.action == AVOID]}")
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
    p.add_argument("--watermark-delay-s", type=float, default=None,
                   help="the streaming job's stream.watermark_delay_s (default: the configured one)")
    p.add_argument("--no-gate", dest="gate", action="store_false", help="skip the GX gate (faster)")
    p.add_argument("--policy", nargs="*", default=[], metavar="KEY=VALUE",
                   help="override [policy] keys, e.g. base_avoid_s=60 hysteresis_s=100")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    cfg = Config().replace(**{f"policy__{k}": float(v) for k, v in (kv.split("=", 1) for kv in args.policy)})
    if args.watermark_delay_s is not None:
        cfg = cfg.replace(stream__watermark_delay_s=args.watermark_delay_s)
    print(f"broker-outage: {args.producers} producers, broker-b down {args.outage_s:.0f}s from 30s; "
          f"publisher every {args.cycle_s:.0f}s (simulated), the job reads {args.lag_s:.0f}s behind, "
          f"watermark delay {cfg.stream.watermark_delay_s:.0f}s")
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
