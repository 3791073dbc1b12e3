"""``faultwatch replay faults|alloc|lag``: run rule cases through our rules (see pipeline.replay)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``replay`` subcommand; its handler reads stdin and writes stdout."""
    from pipeline.replay import add_arguments

    parser = subparsers.add_parser(
        "replay",
        help="replay fault, allocation or lag status cases (JSON lines on stdin) through the rules",
        description="Reads one case per line on stdin and writes the Java oracle's result shape (faults, "
        "alloc) or Burrow's lag verdict (lag), one JSON object per line, on stdout. Bad lines yield an "
        "error object and processing goes on.",
    )
    add_arguments(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """0 when every line replayed, 1 when some line was bad, 2 on a usage error."""
    from pipeline.replay import run_replay

    try:
        return run_replay(args.kind, args.version, sys.stdin, sys.stdout, args.rules)
    except ValueError as exc:
        print(f"faultwatch replay: {exc}", file=sys.stderr)
        return 2
