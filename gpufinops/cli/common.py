"""What every subcommand shares: settings from --config, the -o/--output option, exit codes, usage errors.

Subcommand modules import this, never `app` (the parser imports them).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from ..model import format_duration
from ..words import render_table  # noqa: F401  (the one text table, re-exported for the commands)

if TYPE_CHECKING:
    from ..config import Settings


def state_dir() -> Path:
    """Where a command run without a config keeps its database and outbox: $XDG_STATE_HOME/gpufinops, else
    ~/.local/state/gpufinops (never the current folder)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpufinops"


def load_settings_from_args(args: argparse.Namespace, *, uses_database: bool = True) -> "Settings":
    """Settings from --config (or $GPUFINOPS_CONFIG). Without a config, the default SQLite database and the outbox
    live in the user's state folder (`state_dir()`), said once on stderr, instead of appearing in the current
    folder; a command given --db uses that. `uses_database=False`: the command never opens the database."""
    from ..config import Settings, load_settings

    path = getattr(args, "config", None) or os.environ.get("GPUFINOPS_CONFIG")
    settings = load_settings(path)
    if path or not uses_database or getattr(args, "db", None):
        return settings
    defaults = Settings.model_fields
    if settings.database_url != defaults["database_url"].default:
        return settings
    folder = state_dir()
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "gpufinops.db"
    slack = settings.slack
    if slack.outbox_path == type(slack).model_fields["outbox_path"].default:
        slack = slack.model_copy(update={"outbox_path": str(folder / slack.outbox_path)})
    print(f"note: no --config: using the database {db} (your state folder; pass --config or --db to choose one)",
          file=sys.stderr)
    return settings.model_copy(update={"database_url": f"sqlite:///{db}", "slack": slack})


format_window = format_duration  # a window as every command prints it: the one duration formatter


def format_share(fraction: float | None) -> str:
    """A share (0..1, e.g. idle_share) as every command prints it: "37.5 %"."""
    return "" if fraction is None else f"{100 * fraction:.1f} %"


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


SHARE_COLUMNS = ("idle_share",)  # fractions 0..1, printed as %


def print_frame(df, right: Sequence[str] | None = None) -> None:
    """A pandas table through `render_table`: numbers right-aligned with thousands separators (2 decimals),
    shares (SHARE_COLUMNS, *_share) as %, windows (*_window_s) as "2 h"."""
    import math

    columns = [str(c) for c in df.columns]
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    numeric = [str(c) for c in df.columns if is_numeric_dtype(df[c]) and not is_bool_dtype(df[c])]

    def cell(col: str, v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        if isinstance(v, str):
            return v  # words where a figure is not known ("unknown (no priced evaluation)")
        if col in SHARE_COLUMNS or col.endswith("_share"):
            return format_share(float(v))
        if col.endswith("_window_s"):
            return format_window(float(v))
        if isinstance(v, float):
            return f"{v:,.2f}"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return str(v)

    rows = [{c: cell(c, v) for c, v in zip(columns, rec)} for rec in df.itertuples(index=False, name=None)]
    print(render_table(rows, columns, right=numeric if right is None else right))
