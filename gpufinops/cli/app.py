# PYTHON_ARGCOMPLETE_OK
"""The command line's parser and `main`. Each capability module of this package registers its own subcommands.

A capability module (`core`, `billing`, ...) exposes `register(subparsers)`; its subcommand handlers have the
signature `handler(args) -> int`, load settings with `common.load_settings_from_args(args)` and build the live
peers through `gpufinops.compose`. Registering imports argparse only: every heavy library (pandas, boto3,
SQLAlchemy, pydantic) is imported inside the handler that needs it, so `gpufinops --help` and shell completion
start fast.

Conventions every subcommand follows:
- `-o/--output table|json|csv` chooses the format of what is printed; JSON and CSV go to stdout,
  progress, warnings and errors to stderr, so `-o json | jq` always works.
- Exit codes: 0 done, every data source answered; 1 the command ran and found a problem (a broken rule in
  `rules check`, a data source that failed, named in an `error: <source>: ...` line: Prometheus, EC2,
  billing); 2 the command could not run as asked
  (a bad flag value such as `--month 2024-13`, a bad config file, a missing database file).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from . import agent, backtest, billing, core, k8s, recommend, report, slurm
from .common import EXIT_PROBLEM_FOUND, EXIT_USAGE

CAPABILITIES = (core, billing, recommend, backtest, report, agent, k8s, slurm)  # the order of `gpufinops --help`


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpufinops")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class VersionAction(argparse.Action):
    """`--version`, read from the package metadata only when asked (importlib.metadata costs start-up time)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"gpufinops {package_version()}")  # on stdout, as argparse's own version action
        parser.exit()


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
    parser.add_argument("--version", action=VersionAction, help="show the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for capability in CAPABILITIES:
        capability.register(sub)
    return parser


def enable_shell_completion(parser: argparse.ArgumentParser) -> None:
    """Tab completion of subcommands and flags (bash/zsh: `eval "$(register-python-argcomplete gpufinops)"`).

    argcomplete answers and exits only when the shell asks (it sets _ARGCOMPLETE); otherwise this does nothing.
    """
    if "_ARGCOMPLETE" not in os.environ:  # not a completion request: skip importing argcomplete
        return
    try:
        import argcomplete
    except ImportError:  # an install without the dependency still runs, only without completion
        return
    argcomplete.autocomplete(parser)


# Libraries whose INFO lines are noise in our log (APScheduler's "Adding job tentatively" per job, botocore's
# "Found credentials in ..."): shown from WARNING, or everything with --log-level DEBUG.
NOISY_LOGGERS = ("apscheduler", "botocore", "boto3", "urllib3", "kubernetes")


def quiet_third_party_logs(level: int) -> None:
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if level <= logging.DEBUG else logging.WARNING)


def lost_value(action: argparse.Action, value) -> bool:
    """Whether a one-value option holds the empty list argparse makes of `--flag=--` (`append`: as one item)."""
    if isinstance(action, argparse._StoreAction):
        return value == [] and action.default != []
    if isinstance(action, argparse._AppendAction):
        return isinstance(value, list) and [] in value
    return False


def refuse_lost_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """argparse (before Python 3.12.?) turns `--db=--` into an empty list instead of a value or an error: the
    command would then fail on a list where it expects text. Every one-value option of the parsers this command
    went through must hold a value (or its default), else a usage error naming the flag (exit 2)."""
    while parser is not None:
        sub = None
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(getattr(args, action.dest, None) or "")
            elif action.nargs is None and lost_value(action, getattr(args, action.dest, None)):
                parser.error(f"argument {'/'.join(action.option_strings) or action.dest}: expected one argument")
        parser = sub


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    enable_shell_completion(parser)
    args = parser.parse_args(argv)
    refuse_lost_values(parser, args)
    level = getattr(logging, str(args.log_level).upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_third_party_logs(level)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from ..collect.errors import QueryFailed
    from ..config import ConfigError

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
    except Exception as exc:
        # The database is a data source like Prometheus: one that cannot be opened or answered (a database_url
        # naming a folder or a file that is not a database, a lost server) is one line and exit 1. SQLAlchemy
        # is looked up, not imported: a command that never loaded it cannot fail in it.
        database = sys.modules.get("sqlalchemy.exc")
        if database is None or not isinstance(exc, database.SQLAlchemyError):
            raise
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        print(f"error: database: {reason}", file=sys.stderr)
        return EXIT_PROBLEM_FOUND


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
