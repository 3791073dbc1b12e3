"""``faultwatch publish``: one avoidance cycle (load → recommend → validate → publish)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from faultwatch.commands.common import add_config_arg, config_from_args

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.publish import CycleReport

log = logging.getLogger("faultwatch.publish")

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
        help="keep running one cycle per publish.interval_s until interrupted (without Airflow)",
    )
    p.add_argument(
        "--cycles",
        type=int,
        default=None,
        metavar="N",
        help="with --every: stop after N cycles (default: run until interrupted)",
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
    import time

    from pipeline.publish import run_cycle

    if args.cycles is not None and (not args.every or args.cycles < 1):
        print(f"faultwatch publish: --cycles needs --every and at least 1, got {args.cycles}", file=sys.stderr)
        return 2
    cfg = config_from_args(args)
    if not args.every:
        report = run_cycle(cfg, cycle_number=args.cycle_id)
        _print_report(report)
        return EXIT_CODES[report.status]
    interval, done = cfg.publish.interval_s, 0
    while True:
        try:
            _print_report(run_cycle(cfg))
        except Exception:  # one bad cycle must not stop the loop; the next one retries
            log.exception("publisher cycle failed")
        done += 1
        if args.cycles is not None and done >= args.cycles:
            return 0
        time.sleep(interval - (time.time() % interval))
