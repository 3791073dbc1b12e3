"""The lag and fault steps of one bench cluster outside Spark, at a fleet factor, in one process.

Run: ``.venv/bin/python bench/fleet_steps.py lag|faults [--fleet 100] [--seconds 150] [--batches 2]
[--profile]``. Simulates cluster ``bench-0`` of bench/stream.py's backlog (bench/fleet.py grows it)
into memory, cuts its events into ``--batches`` micro-batches of event time, hands each to the
state keys as the readers would (``streaming.feeds``: the lag keys, or the fault keys of
``faults.shards``), and prints the CPU time of the steps alone, the rows each table got and, with
``--profile``, cProfile's top functions. One core, no Spark: where a fleet's extra time goes in the
steps, and a check that a change writes the same rows (``--save`` pickles them for comparison).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import itertools
import pickle
import pstats
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stream import instance_scenario
from pipeline.config import Config
from pipeline.faults.concern import BrokerFaults
from pipeline.faults.events import EVENT_COLUMNS
from pipeline.lag.concern import GridLag
from pipeline.simulate import MemorySink, Simulation
from pipeline.stateful import Clock, Concern
from schemas.tables import table
from streaming.feeds import fault_feed, lag_feed, plain

BRONZE = {"send_result": "send_results", "consumer_progress": "consumer_progress",
          "group_membership": "group_membership"}


def bronze_tables(fleet: int, seconds: float) -> dict[str, pa.Table]:
    """One cluster's simulated events as bronze tables (Kafka coordinates made up, unique)."""
    sink = MemorySink()
    Simulation(instance_scenario(0, seconds, fleet), seed=1).run(sink)
    out, offset = {}, 0
    for kind, name in BRONZE.items():
        rows = []
        for event in sink.events(kind):
            row = dataclasses.asdict(event)
            row.update(kafka_topic=f"rmq.{kind}", kafka_partition=offset % 4, kafka_offset=offset,
                       kafka_ts_ms=row["ts_ms"])
            offset += 1
            rows.append(row)
        schema = table(name).arrow_schema()
        rows_table = pa.Table.from_pylist(rows)
        fields = [schema.field(c) for c in schema.names if c in rows_table.column_names]
        out[name] = rows_table.select([f.name for f in fields]).cast(pa.schema(fields))
    return out


def batches(tables: dict[str, pa.Table], n: int) -> Iterator[tuple[dict[str, pa.Table], int]]:
    """``n`` slices of equal event time, each with its settle point (just before the next one)."""
    lo = min(pc.min(t["ts_ms"]).as_py() for t in tables.values())
    hi = max(pc.max(t["ts_ms"]).as_py() for t in tables.values())
    edges = [lo + (hi - lo + 1) * i // n for i in range(n + 1)]
    for a, b in itertools.pairwise(edges):
        yield ({name: t.filter(pc.and_(pc.greater_equal(t["ts_ms"], a), pc.less(t["ts_ms"], b)))
                for name, t in tables.items()}, b - 1 if b < edges[-1] else hi)


def keyed(what: str, part: dict[str, pa.Table], cfg: Config) -> dict[str, dict[str, list[pa.Table]]]:
    """A batch's chunks per state key, as the readers cut them."""
    feed = (lag_feed(part, shards=cfg.lag.shards) if what == "lag"
            else fault_feed(part["send_results"], EVENT_COLUMNS, cfg.faults.shards))
    out: dict[str, dict[str, list[pa.Table]]] = {}
    for key, name, rows in feed:
        out.setdefault(key, {}).setdefault(name, []).append(plain(rows))
    return out


def run(what: str, tables: dict[str, pa.Table], n: int, profile: cProfile.Profile | None
        ) -> tuple[float, dict[str, pa.Table]]:
    """The steps' CPU seconds over the batches, and every table's rows (``_points`` included)."""
    cfg = Config()
    concern: Concern[Any] = GridLag(cfg.lag) if what == "lag" else BrokerFaults(cfg.faults)
    states: dict[str, Any] = {}
    rows: dict[str, list[pa.Table]] = {}
    watermark, cpu = 0, 0.0
    for part, settle in batches(tables, n):
        chunks = keyed(what, part, cfg)
        for key in sorted(set(chunks) | set(states)):
            state = states.get(key) or concern.initial("bench-0")
            events = concern.events(chunks.get(key, {}))
            start = time.process_time()
            if profile:
                profile.enable()
            done = concern.step(state, events, Clock(watermark, max(settle, watermark), None, False))
            if profile:
                profile.disable()
            cpu += time.process_time() - start
            states[key] = concern.decode(concern.encode(done.state))  # as the state store keeps it
            for name, t in done.tables.items():
                rows.setdefault(name, []).append(t)
        watermark = max(settle, watermark)
    return cpu, {name: pa.concat_tables(parts) for name, parts in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["lag", "faults"])
    ap.add_argument("--fleet", type=int, default=100, help="fleet factor (bench/fleet.py), default 100")
    ap.add_argument("--seconds", type=float, default=150.0, help="simulated seconds, default 150")
    ap.add_argument("--batches", type=int, default=2, help="micro-batches of event time, default 2")
    ap.add_argument("--profile", action="store_true", help="cProfile the steps (slower)")
    ap.add_argument("--sort", default="tottime", help="the profile's order: tottime or cumulative")
    ap.add_argument("--save", default="", help="pickle the rows written, per table, to this file")
    args = ap.parse_args()
    tables = bronze_tables(args.fleet, args.seconds)
    print("events:", {name: t.num_rows for name, t in tables.items()}, flush=True)
    profile = cProfile.Profile() if args.profile else None
    cpu, rows = run(args.what, tables, args.batches, profile)
    print(f"{args.what} steps, fleet x{args.fleet}, {args.batches} batches: {cpu:.3f} CPU-s; rows",
          {name: t.num_rows for name, t in sorted(rows.items())})
    if args.save:
        Path(args.save).write_bytes(pickle.dumps({name: t.to_pylist() for name, t in rows.items()}))
    if profile:
        pstats.Stats(profile).sort_stats(args.sort).print_stats(30)


if __name__ == "__main__":
    main()
