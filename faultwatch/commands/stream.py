"""``faultwatch stream``: the production streaming job."""

from __future__ import annotations

import argparse
import sys

from faultwatch.commands.common import add_config_arg, config_from_args
from streaming.job import CONCERNS, DEFAULT_CONCERNS  # a plain module: importing it starts no Spark


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stream", help="run the streaming job (Kafka -> Spark -> Delta)")
    add_config_arg(p)
    p.add_argument(
        "--once", action="store_true", help="process what is available now, then exit (availableNow trigger)"
    )
    p.add_argument("--duration", type=float, default=None, metavar="SECONDS", help="stop after this long")
    p.add_argument(
        "--only",
        action="append",
        default=None,
        choices=sorted(CONCERNS),
        metavar="CONCERN",
        help=f"run only these queries, repeatable; one of {', '.join(sorted(CONCERNS))} "
        f"(default: {' and '.join(DEFAULT_CONCERNS)})",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    from streaming.job import run_stream
    from streaming.session import JavaMissingError

    try:
        return run_stream(cfg, once=args.once, duration_s=args.duration, concerns=args.only)
    except JavaMissingError as exc:
        print(f"faultwatch stream: {exc}")
        return 1
    except ValueError as exc:  # a clash of --only concerns, named by build_queries
        print(f"faultwatch stream: {exc}", file=sys.stderr)
        return 2
