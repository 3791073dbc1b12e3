"""``faultwatch kafka``: a local Kafka-protocol broker (Tansu) with the configured topics."""

from __future__ import annotations

import argparse

from faultwatch.commands.common import add_config_arg, config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kafka", help="run a local Kafka-protocol broker (Tansu, in memory) with the topics")
    add_config_arg(p)
    p.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.kafka_local import LocalKafkaError, serve_forever

    cfg = config_from_args(args)
    try:
        return serve_forever(args.port, cfg.topics.all(), cfg.kafka.partitions)
    except LocalKafkaError as exc:
        print(f"faultwatch kafka: {exc}")
        return 1
