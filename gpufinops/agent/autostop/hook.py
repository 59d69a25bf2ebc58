"""Run one configured argv (the pre-stop hook, wall, a stop command): never a shell, always a timeout.

The command runs in its own process group, so a timeout kills it with everything it started (a hook script's
`docker stop` child would otherwise keep running). Its output is kept short for the log: it is the command's
text, not ours.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Sequence

from ...procs import run_bounded
from .settings import argv_problem

_OUTPUT_CHARS = 300


@dataclass(frozen=True)
class CommandResult:
    ok: bool
    reason: str  # what happened, in words, for the log and the alert


def _tail(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _OUTPUT_CHARS else "…" + text[-_OUTPUT_CHARS:]


def run_command(argv: Sequence[str], timeout_s: float, *, what: str = "command") -> CommandResult:
    """Run `argv`; ok only when it exited 0 within `timeout_s`."""
    problem = argv_problem(list(argv))
    if problem:  # settings validate this already; a caller passing something else is refused, not run
        return CommandResult(False, f"{what} not run: {problem}")
    try:
        returncode, out, _ = run_bounded(argv, timeout_s, merge_stderr=True)
    except OSError as exc:
        return CommandResult(False, f"{what} {argv[0]} could not start: {exc.strerror or exc}")
    except subprocess.TimeoutExpired:
        return CommandResult(False, f"{what} {argv[0]} did not finish within {timeout_s:g}s; killed")
    if returncode != 0:
        detail = _tail(out)
        return CommandResult(False, f"{what} {argv[0]} exited {returncode}" + (f": {detail}" if detail else ""))
    return CommandResult(True, f"{what} {argv[0]} exited 0")
