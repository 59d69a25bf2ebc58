"""The command line. Each capability registers its own subcommands.

A capability module `gpufinops.cli_<name>` exposes `register(subparsers)`; its
subcommand handlers have the signature `handler(args) -> int` and load settings
themselves with `load_settings_from_args(args)`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from .config import ConfigError, Settings, load_settings

CAPABILITY_CLI_MODULES = (
    "gpufinops.cli_core",
    "gpufinops.cli_billing",
    "gpufinops.cli_recommend",
    "gpufinops.cli_backtest",
    "gpufinops.cli_report",
    "gpufinops.cli_agent",
)


def load_settings_from_args(args: argparse.Namespace) -> Settings:
    path = getattr(args, "config", None) or os.environ.get("GPUFINOPS_CONFIG")
    return load_settings(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufinops",
        description="FinOps cost and idle-GPU governance: idle verdicts, safe auto-shutdown, budgets, right-sizing.",
    )
    parser.add_argument(
        "--config", "-c", default=None,
        help="path to gpufinops.yaml (default: $GPUFINOPS_CONFIG, else built-in defaults)",
    )
    parser.add_argument("--log-level", default=os.environ.get("GPUFINOPS_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in CAPABILITY_CLI_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # capability not built in this checkout
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
