"""The ``faultwatch`` command line.

Each subcommand lives in ``faultwatch/commands/<name>.py`` with ``register(subparsers)``, which adds its
parser and sets ``handler`` (a function ``(args) -> int``). Modules import their heavy dependencies
(Spark, Kafka) inside the handler, so ``faultwatch --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from pipeline.config import ConfigError

COMMANDS = ("demo", "lab", "stream", "kafka", "simulate", "replay", "publish", "report", "serve", "maintain")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="faultwatch", description="Live fault detection for Apache RocketMQ clusters."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"faultwatch.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"faultwatch.commands.{name}":
                continue  # not built yet in this checkout
            raise
        module.register(sub)
    return parser


def _not_great_expectations_chatter(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or not record.name.startswith("great_expectations")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("kafka", "py4j", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args.verbose:
        # Great Expectations sets some of its loggers to INFO itself when imported (each publisher
        # cycle then logs its temporary docs folder): keep its records below WARNING out.
        for handler in logging.getLogger().handlers:
            handler.addFilter(_not_great_expectations_chatter)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except ConfigError as exc:
        print(f"faultwatch: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("faultwatch: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
