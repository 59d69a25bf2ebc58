# PYTHON_ARGCOMPLETE_OK
"""The command line. Each capability registers its own subcommands.

A capability module `gpufinops.cli_<name>` exposes `register(subparsers)`; its
subcommand handlers have the signature `handler(args) -> int` and load settings
themselves with `load_settings_from_args(args)`.

Conventions every subcommand follows:
- `-o/--output table|json|csv` chooses the format of what is printed; JSON and CSV go to stdout,
  progress, warnings and errors to stderr, so `-o json | jq` always works.
- Exit codes: 0 done; 1 the command ran and found a problem (a broken rule in `rules check`,
  an evaluation error, a budget or billing source that failed); 2 the command could not run as asked
  (a bad flag value such as `--month 2024-13`, a bad config file, a missing database file).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from importlib.metadata import PackageNotFoundError, version

from .collect.errors import QueryFailed
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


EXIT_PROBLEM_FOUND = 1  # the command ran and found a problem
EXIT_USAGE = 2  # the command could not run as asked (bad flag value, bad config); argparse's own code too

OUTPUT_FORMATS = ("table", "json", "csv")


def add_output_option(parser: argparse.ArgumentParser, choices: tuple[str, ...] = OUTPUT_FORMATS) -> None:
    """`-o/--output`, the one format option of every subcommand (the old `--format` still works, unlisted)."""
    parser.add_argument("-o", "--output", choices=choices, default="table",
                        help=f"what to print: {' | '.join(choices)} (default table; json and csv go to stdout)")
    parser.add_argument("--format", dest="output", choices=choices, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def usage_error(message: str) -> int:
    """Print `error: ...` on stderr and return the exit code of a command that could not run as asked."""
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def package_version() -> str:
    try:
        return version("gpufinops")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


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
    parser.add_argument("--version", action="version", version=f"gpufinops {package_version()}")
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


def enable_shell_completion(parser: argparse.ArgumentParser) -> None:
    """Tab completion of subcommands and flags (bash/zsh: `eval "$(register-python-argcomplete gpufinops)"`).

    argcomplete answers and exits only when the shell asks (it sets _ARGCOMPLETE); otherwise this does nothing.
    """
    try:
        import argcomplete
    except ImportError:  # an install without the dependency still runs, only without completion
        return
    argcomplete.autocomplete(parser)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    enable_shell_completion(parser)
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
        # One line per error (a file may hold several), each `error: file:line: key '...': message`.
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_USAGE
    except QueryFailed as exc:  # a data source failed (Prometheus down, a timeout): one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_PROBLEM_FOUND


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
