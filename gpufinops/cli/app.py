# PYTHON_ARGCOMPLETE_OK
"""The command line's parser and `main`. Each capability module of this package registers its own subcommands.

A capability module (`core`, `billing`, ...) exposes `register(subparsers)`; its subcommand handlers have the
signature `handler(args) -> int`, load settings with `common.load_settings_from_args(args)` and build the live
peers through `gpufinops.compose`. Registering imports argparse only: every heavy library (pandas, boto3,
SQLAlchemy, pydantic) is imported inside the handler that needs it, so `gpufinops --help` and shell completion
start fast. A command line naming a command imports only the module that registers it (`COMMAND_MODULES`): the
other commands' modules, their arguments and what they import are never loaded for it.

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
import importlib
import logging
import os
import sys

from .common import EXIT_PROBLEM_FOUND, EXIT_USAGE

CAPABILITIES = ("core", "billing", "recommend", "backtest", "report", "agent", "k8s", "slurm")  # `gpufinops --help`'s order
# The module of this package that registers each command. A command line naming one of them builds a parser with
# that module's commands only; `gpufinops --help`, no command, an unknown one and shell completion build the whole
# parser (every module). tests/cli/test_start.py holds this table equal to what the modules register.
COMMAND_MODULES = {
    "serve": "core", "evaluate": "core", "rules": "core", "audit": "core", "demo": "core",
    "costs": "billing", "budgets": "billing", "recommend": "recommend", "size": "recommend",
    "backtest": "backtest", "report": "report", "agent": "agent", "k8s": "k8s", "slurm": "slurm",
}


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


def add_global_options(parser: argparse.ArgumentParser, version_action: type[argparse.Action] | str = None) -> None:
    """The options before the command (`gpufinops --config FILE costs ...`); `version_action`: what --version
    does (default: print the version and exit)."""
    parser.add_argument(
        "--config", "-c", default=None,
        help="path to gpufinops.yaml (default: $GPUFINOPS_CONFIG, else built-in defaults)",
    )
    parser.add_argument("--log-level", default=os.environ.get("GPUFINOPS_LOG_LEVEL", "INFO"))
    parser.add_argument("--version", action=version_action or VersionAction, help="show the installed version and exit")


def build_parser(modules: tuple[str, ...] = CAPABILITIES) -> argparse.ArgumentParser:
    """The command line's parser with the commands of `modules` (default: every command)."""
    parser = argparse.ArgumentParser(
        prog="gpufinops",
        description="FinOps cost and idle-GPU governance: idle verdicts, safe auto-shutdown, budgets, right-sizing.",
    )
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in modules:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    return parser


class _NotACommandLine(Exception):
    pass


class _CommandFinder(argparse.ArgumentParser):
    """The global options and the first word after them, read by argparse's own rules (abbreviations, `-cFILE`,
    `--config=FILE`); never prints or exits: a command line it cannot read is the whole parser's to judge."""

    def error(self, message):
        raise _NotACommandLine(message)

    def exit(self, status=0, message=None):
        raise _NotACommandLine(message)


def modules_for(argv: list[str] | None) -> tuple[str, ...]:
    """The modules a parser for `argv` needs: the one registering the command it names; none for `--version`
    alone (it prints and exits while the options are read); else every module (no command, an unknown one,
    `--help` before it, a shell completion request)."""
    if "_ARGCOMPLETE" in os.environ:
        return CAPABILITIES
    finder = _CommandFinder(prog="gpufinops", add_help=False)
    add_global_options(finder, version_action="store_true")  # only read here: the parser built next acts on it
    finder.add_argument("-h", "--help", action="store_true")
    finder.add_argument("words", nargs=argparse.REMAINDER)
    try:
        found, _ = finder.parse_known_args(sys.argv[1:] if argv is None else argv)
    except _NotACommandLine:
        return CAPABILITIES
    if found.help:
        return CAPABILITIES
    if not found.words:
        return () if found.version else CAPABILITIES
    module = COMMAND_MODULES.get(found.words[0])
    return (module,) if module else CAPABILITIES


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
NOISY_LOGGERS = ("apscheduler", "botocore", "boto3", "urllib3", "kubernetes", "azure", "msal")


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


def parse_with_suggestions(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`parser.parse_args`, but an unknown flag is refused by the subcommand that was given it, with its usage
    and the nearest flag it has ("did you mean --once?"), not the top-level usage alone (exit 2 either way)."""
    args, unknown = parser.parse_known_args(argv)
    if not unknown:
        return args
    import difflib  # only to suggest a flag: its import is a few ms of every command's start

    deepest = parser
    while True:  # the subcommand chain the arguments went down: its last parser owns the flags
        sub = next((a for a in deepest._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = sub.choices.get(getattr(args, sub.dest, None) or "") if sub is not None else None
        if chosen is None:
            break
        deepest = chosen
    flags = [o for a in deepest._actions for o in a.option_strings]  # hidden ones too: they still work
    hints = []
    for arg in unknown:
        near = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1, cutoff=0.6) if arg.startswith("-") else []
        hints.append(f"{arg} (did you mean {near[0]}?)" if near else arg)
    deepest.error(f"unrecognized arguments: {' '.join(hints)}")


def main(argv: list[str] | None = None) -> int:
    modules = modules_for(argv)
    parser = build_parser(modules)
    enable_shell_completion(parser)
    args = parse_with_suggestions(parser, argv)
    refuse_lost_values(parser, args)
    level = getattr(logging, str(args.log_level).upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_third_party_logs(level)
    if not getattr(args, "func", None):  # `gpufinops rules`: no action given; the help lists every command
        (parser if modules == CAPABILITIES else build_parser()).print_help()
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
