"""``faultwatch maintain``: compact, checkpoint and vacuum every Delta table under storage.root once.

The streaming job runs the same steps itself between micro-batches ([maintenance] in the config),
and the publisher on its own tables after its cycles; this command is for a job run with
``maintenance.enabled = false``, and for an Airflow task or a cron entry.
"""

from __future__ import annotations

import argparse

from faultwatch.commands.common import add_config_arg, config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("maintain", help="compact, checkpoint and vacuum the Delta tables once")
    add_config_arg(p)
    p.add_argument("--table", action="append", default=None, metavar="NAME",
                   help="only this table (repeatable; default: every table under storage.root)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.config import ConfigError
    from pipeline.deltaio import table_exists
    from pipeline.maintenance import maintain_all
    from schemas.tables import all_tables

    cfg = config_from_args(args)
    known = sorted(all_tables())
    unknown = [t for t in args.table or [] if t not in known]
    if unknown:
        raise ConfigError(f"--table: unknown {unknown}; known tables: {known}")
    names = [t for t in (args.table or known) if table_exists(cfg.storage.root, t)]
    results = maintain_all(cfg.storage.root, names, cfg.maintenance)
    for result in results:
        print(result.describe(), flush=True)
    return 1 if any(r.error for r in results) else 0
