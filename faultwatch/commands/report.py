"""``faultwatch report``: write one self-contained HTML report of the Delta tables."""

from __future__ import annotations

import argparse
import time

from faultwatch.commands.common import add_config_arg, config_from_args
from faultwatch.commands.simulate import parse_duration


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write an HTML report (plots) of the Delta tables")
    add_config_arg(p)
    p.add_argument("--out", default=None, help="HTML file (default: <storage.root>/../report/faultwatch-report.html)")
    p.add_argument("--last", type=parse_duration, default=None, help="only the last period, e.g. 2h (default: all)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.report import write_report

    cfg = config_from_args(args)
    since = None if args.last is None else int((time.time() - args.last) * 1000)
    path = write_report(cfg.storage.root, args.out, since_ms=since)
    print(path)
    return 0
