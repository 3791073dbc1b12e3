"""Arguments shared by subcommands."""

from __future__ import annotations

import argparse

from pipeline.config import Config, load_config


def add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="TOML config (default: the shipped conf/faultwatch.toml)",
    )


def config_from_args(args: argparse.Namespace) -> Config:
    return load_config(args.config)
