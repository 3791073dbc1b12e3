"""``faultwatch publish``: one avoidance cycle (load → recommend → validate → publish), or ``--every``
/ ``--watch`` for the loop of regular and early cycles (:mod:`pipeline.publish.watch`)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from faultwatch.commands.common import add_config_arg, config_from_args

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.publish import CycleReport

EXIT_CODES = {"published": 0, "rejected": 3, "skipped": 4, "failed": 5}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "publish",
        help="run one avoidance publisher cycle",
        description=(
            "Read the silver Delta tables, decide which brokers producers should avoid, validate the list "
            "with Great Expectations, and publish it (Kafka topic, one JSON file per cluster, Delta history). "
            "Re-running a cycle publishes nothing twice. Exit code 0: published; 3: validation failed, "
            "nothing published, an alert was sent; 4: skipped (this cycle was already published, or "
            "another publisher or a later cycle has it), with the reason printed; 5: failed (the broker, "
            "file or table is named)."
        ),
    )
    add_config_arg(p)
    p.add_argument(
        "--cycle-id",
        type=int,
        default=None,
        metavar="N",
        help="cycle identity, its logical time in Unix ms (default: now aligned down to publish.interval_s); "
        "a cycle at or before the last published one is skipped",
    )
    p.add_argument(
        "--every",
        action="store_true",
        help="keep running one cycle per publish.interval_s until interrupted (without Airflow); between "
        "them, a new fault episode starts a cycle at once (publish.watch_interval_s)",
    )
    p.add_argument(
        "--watch",
        action="store_true",
        help="only the early cycles: run one whenever a new fault episode appears, never on the interval "
        "(beside the Airflow DAG, which keeps the regular cadence)",
    )
    p.add_argument(
        "--cycles",
        type=int,
        default=None,
        metavar="N",
        help="with --every or --watch: stop after N cycles, early ones included (default: run until interrupted)",
    )
    p.set_defaults(handler=run)


def _print_report(report: CycleReport) -> None:
    line = f"cycle {report.cycle_id}: {report.status}"
    if report.status in ("skipped", "failed"):
        line += f" ({report.reason})"
    if report.decision is not None:
        avoided = [f"{r.cluster}/{r.broker_name}" for r in report.decision.recommendations() if r.action == "avoid"]
        line += f"; avoid {', '.join(avoided) if avoided else 'nothing'}"
    if report.gate is not None and not report.gate.success:
        line += f"; {report.gate.summary()}"
    line += f"; alert records sent: {report.alerts}"
    print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    from pipeline.publish import run_cycle
    from pipeline.publish.watch import cycle_loop

    looping = args.every or args.watch
    if args.cycles is not None and (not looping or args.cycles < 1):
        print(f"faultwatch publish: --cycles needs --every or --watch and at least 1, got {args.cycles}",
              file=sys.stderr)
        return 2
    if args.every and args.watch:
        print("faultwatch publish: --every already runs the early cycles; --watch is for beside the DAG",
              file=sys.stderr)
        return 2
    cfg = config_from_args(args)
    if not looping:
        report = run_cycle(cfg, cycle_number=args.cycle_id)
        _print_report(report)
        return EXIT_CODES[report.status]
    if args.watch and cfg.publish.watch_interval_s <= 0:
        print("faultwatch publish: --watch needs publish.watch_interval_s > 0", file=sys.stderr)
        return 2
    cycle_loop(cfg, lambda number: _print_report(run_cycle(cfg, cycle_number=number)),
               regular=args.every, cycles=args.cycles)
    return 0
