"""``faultwatch serve``: /metrics, the JSON API, the live page and /healthz (see pipeline/serve)."""

from __future__ import annotations

import argparse
import logging

from faultwatch.commands.common import add_config_arg, config_from_args

log = logging.getLogger("faultwatch.serve")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve Prometheus metrics, a JSON API, a live page and /healthz over the Delta tables",
        description="Reads the Delta tables with deltalake (no Spark), refreshes them in the background "
        "and serves GET /metrics, /v3/rocketmq/..., / and /healthz until interrupted.",
    )
    add_config_arg(p)
    p.add_argument("--port", type=int, default=None, help="TCP port (default: serve.port; 0 = any free port)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.serve import Server

    cfg = config_from_args(args)
    server = Server(cfg, port=args.port)
    s = cfg.serve
    auth = f"basic auth for user {s.basic_auth_username!r}" if s.basic_auth_username else "no authentication"

    def ready(url: str) -> None:
        log.info("tables under %s, refreshed every %gs; %s", cfg.storage.root, s.refresh_interval_s, auth)
        print(f"faultwatch serve: listening on {url}", flush=True)

    server.run(on_ready=ready)
    return 0
