"""``faultwatch simulate``: run a scenario and write its events to Kafka or JSON-lines files."""

from __future__ import annotations

import argparse
import re
import sys
import time

from faultwatch.commands.common import add_config_arg, config_from_args
from pipeline.simulate.sinks import COMPRESSIONS

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds from "90", "90s", "2m", "1.5h" or "500ms"."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}; use e.g. 90, 90s, 2m, 1h")
    return float(match[1]) * _UNITS[match[2]]


def parse_speed(text: str) -> float:
    """A positive factor, or 0 / "max" for as fast as possible."""
    if text.strip().lower() in ("max", "0", "inf"):
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad speed {text!r}; use a number such as 1 or 10, or 'max'") from None
    if value < 0:
        raise argparse.ArgumentTypeError("speed must be >= 0")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a RocketMQ cluster and emit its events")
    add_config_arg(p)
    p.add_argument("--scenario", default="steady", help="scenario name (conf/scenarios/NAME.toml) or a TOML file")
    p.add_argument("--to", choices=("kafka", "file"), default="kafka", help="where events go (default kafka)")
    p.add_argument("--out", default=None, help="folder for --to file (default data/simulate/<scenario>)")
    p.add_argument("--speed", type=parse_speed, default=0.0,
                   help="virtual seconds per wall second; 0 or 'max' = as fast as possible (default)")
    p.add_argument("--duration", type=parse_duration, default=None, help="run time, e.g. 90s or 5m (default: the scenario's)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    p.add_argument("--epoch", default="auto",
                   help="virtual start time in Unix ms, 'now', or 'auto' (now when paced, else the scenario's)")
    p.add_argument("--compression", choices=COMPRESSIONS, default="zstd",
                   help="codec of the record batches sent to Kafka (default zstd, as producers in production send)")
    p.add_argument("--list", action="store_true", help="list the known scenarios and exit")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.simulate import (
        JsonLinesSink,
        KafkaSink,
        ScenarioError,
        Simulation,
        Sink,
        SinkError,
        available_scenarios,
        load_scenario,
    )

    if args.list:
        for name in available_scenarios():
            print(name)
        return 0
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"faultwatch simulate: {exc}", file=sys.stderr)
        return 2
    if args.duration is not None:
        scenario = scenario.replace(duration_s=args.duration)
    epoch = _epoch(args.epoch, args.speed)
    sim = Simulation(scenario, seed=args.seed, epoch_ms=epoch)
    sink: Sink
    try:
        if args.to == "file":
            out = args.out or f"data/simulate/{scenario.name}"
            sink = JsonLinesSink(out)
            where = out
        else:
            cfg = config_from_args(args)
            sink = KafkaSink(cfg, compression=args.compression)
            where = (f"Kafka {cfg.kafka.bootstrap_servers} ({', '.join(cfg.topics.event_topics().values())}; "
                     f"{args.compression})")
        print(f"simulating {scenario.name!r} (seed {sim.seed}, {scenario.duration_s:g} s virtual, "
              f"speed {'max' if args.speed == 0 else args.speed}) -> {where}", flush=True)
        try:
            stats = sim.run(sink, speed=args.speed)
        except KeyboardInterrupt:
            sink.close()
            print("faultwatch simulate: interrupted; events so far were flushed", file=sys.stderr)
            return 130
        sink.close()
    except SinkError as exc:
        print(f"faultwatch simulate: {exc}", file=sys.stderr)
        return 1
    rate = stats.total / stats.wall_s if stats.wall_s > 0 else float("inf")
    counts = ", ".join(f"{k}={v}" for k, v in stats.events.items())
    print(f"done: {stats.total} events ({counts}) in {stats.wall_s:.1f} s ({rate:,.0f}/s)")
    return 0


def _epoch(text: str, speed: float) -> int | None:
    if text == "auto":
        return int(time.time() * 1000) if speed > 0 else None
    if text == "now":
        return int(time.time() * 1000)
    try:
        return int(text)
    except ValueError:
        raise SystemExit(f"faultwatch simulate: bad --epoch {text!r}; use Unix milliseconds, 'now' or 'auto'") from None
