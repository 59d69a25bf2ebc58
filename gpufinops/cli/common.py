"""What every subcommand shares: settings from --config, the -o/--output option, exit codes, usage errors.

Subcommand modules import this, never `app` (the parser imports them).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..words import render_table  # noqa: F401  (the one text table, re-exported for the commands)

if TYPE_CHECKING:
    from ..config import Settings


def state_dir() -> Path:
    """Where a command run without a config keeps its database and outbox: $XDG_STATE_HOME/gpufinops, else
    ~/.local/state/gpufinops (never the current folder)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpufinops"


def config_path(args: argparse.Namespace) -> str | None:
    """The config file a command reads: --config, else $GPUFINOPS_CONFIG; None: neither, the built-in defaults."""
    return getattr(args, "config", None) or os.environ.get("GPUFINOPS_CONFIG")


def defaults_hold(args: argparse.Namespace) -> bool:
    """Whether `load_settings_from_args(args, uses_database=False)` is the built-in defaults as they stand, known
    without loading the settings' models: no config file, and no environment variable set but blank. The defaults'
    secrets are environment variables (config.secrets.env_secret), and one set but blank is refused at load
    (SecretRef.blank): with any variable blank, the command loads the settings and they say whether it is one of
    theirs. tests/cli/test_start.py holds both halves."""
    return config_path(args) is None and all(value.strip() for value in os.environ.values())


def load_settings_from_args(args: argparse.Namespace, *, uses_database: bool = True) -> "Settings":
    """Settings from --config (or $GPUFINOPS_CONFIG). Without a config, the default SQLite database and the outbox
    live in the user's state folder (`state_dir()`), said once on stderr, instead of appearing in the current
    folder; a command given --db uses that. `uses_database=False`: the command never opens the database."""
    from ..config import Settings, load_settings

    path = config_path(args)
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


def format_window(seconds: float) -> str:
    """A window as every command prints it: the one duration formatter (model.format_duration), imported when
    used, so that a command that prints none does not load the model's classes to start."""
    from ..model import format_duration

    return format_duration(seconds)


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


def int_in(low: int, high: int):
    """argparse `type=` for a whole number within [low, high]: anything else (text, inf, nan, 1e400, a negative
    count) is a usage error naming the flag (exit 2), never a traceback or a nonsense run."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low:,} to {high:,}, got {text!r}")
        return value

    parse.__name__ = "whole number"  # what argparse names in "invalid whole number value"
    return parse


def float_in(low: float, high: float, *, low_open: bool = False):
    """argparse `type=` for a finite number within [low, high] (or (low, high] with low_open); inf and nan are
    refused (exit 2)."""
    import math

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
            raise argparse.ArgumentTypeError(f"expected a number {'above' if low_open else 'from'} {low:g}"
                                             f"{' up' if low_open else ''} to {high:g}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def check_input_path(value: str | None, flag: str) -> None:
    """A data path given on the command line (--path, --trace) that names something other than a file or a folder
    (a device such as /dev/zero, a pipe: reading either may never end), or is empty, is a ConfigError naming the
    flag (exit 2). s3:// URIs, globs and missing paths are left to the reader, which names them."""
    from ..config import ConfigError, not_a_regular_file, printable

    if value is None:
        return
    if not value.strip():
        raise ConfigError(f"{flag} is empty: name a file or folder")
    if "://" in value or any(c in value for c in "*?["):
        return
    why = not_a_regular_file(value)
    if why and why not in ("a folder", "does not exist"):
        raise ConfigError(f"{flag} {printable(value)}: cannot read: {why}")


def check_output_path(value: str | None, flag: str) -> None:
    """A file a command will write (--json, --suggest-out, --chart): refused up front, naming the flag (exit 2),
    when it is empty, holds a NUL, is a folder, or its folder does not exist, instead of failing after the work."""
    from ..config import ConfigError, not_a_regular_file, printable

    if value is None:
        return
    if not value.strip() or "\x00" in value:
        raise ConfigError(f"{flag} {printable(value)!r}: not a file path")
    why = not_a_regular_file(value)
    if why not in ("", "does not exist", "not a regular file"):  # a device such as /dev/null takes writes
        raise ConfigError(f"{flag} {printable(value)}: cannot write: {why}")
    folder = os.path.dirname(value) or "."
    if not os.path.isdir(folder):
        raise ConfigError(f"{flag} {printable(value)}: cannot write: the folder {printable(folder)} does not exist")


def database_url(db: str, flag: str = "--db") -> str:
    """The SQLAlchemy URL of a --db value (a SQLite file path or a URL). A value that cannot name a database (empty,
    a NUL, a folder, a device) is a ConfigError naming the flag (exit 2), before anything opens or creates it."""
    from ..config import ConfigError, not_a_regular_file, printable

    shown = printable(db)
    if not db.strip() or "\x00" in db:
        raise ConfigError(f"{flag} {shown!r}: not a database file or URL")
    if "://" in db:
        return db
    why = not_a_regular_file(db)
    if why and why != "does not exist":  # SQLite creates a missing file; a folder or a device is no database
        raise ConfigError(f"{flag} {shown}: not a database file ({why})")
    return f"sqlite:///{db}"


def open_store(url: str, what: str = ""):
    """The Store at `url`; a file that is not a database, or one that cannot be opened or created there, is a
    ConfigError naming it (`what`, e.g. "--db x.db"; default the URL) with exit 2, never a traceback."""
    from sqlalchemy.exc import SQLAlchemyError

    from ..config import ConfigError, printable
    from ..store.store import Store

    try:
        return Store(url)
    except (SQLAlchemyError, ValueError, OSError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        shown = what or f"database {url.split('@')[-1]}"  # never the password of a database URL
        raise ConfigError(f"{printable(shown)}: cannot open the database: {printable(reason)}") from None


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
