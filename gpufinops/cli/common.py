"""What every subcommand shares: settings from --config, the -o/--output option, exit codes, usage errors.

Subcommand modules import this, never `app` (the parser imports them).
"""

from __future__ import annotations

import argparse
import os
import sys

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Settings


def load_settings_from_args(args: argparse.Namespace) -> "Settings":
    from ..config import load_settings

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


def duration_arg(value: str) -> int:
    """argparse `type=` for a duration flag ("10m", "2h", "7d" or seconds): a bad value is a usage error naming
    the flag (exit 2), never a traceback."""
    from ..rules import parse_duration

    try:
        return parse_duration(value if not value.strip().isdigit() else int(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
