"""The snooze file (/run/gpufinops/snooze-until): one ISO time; while it is in the future, no warning, no stop.

`gpufinops agent snooze 2h` writes it (capped at max_snooze, 7 days by default), `--clear` removes it; a person
may also write it by hand. A snooze is capped on read as well, counted from when the file was written (its
mtime), so a hand-written year 2099 snoozes for the cap, never forever; an unreadable value snoozes for the cap
too (the person meant "keep it running"), and both are said in the reason.

Only a regular file is read, and only its first SNOOZE_READ_LIMIT bytes: a snooze file that is /dev/zero, a FIFO
with no writer or a huge file is unreadable (snoozed for the cap, said), never a hung or exhausted agent.

The file is the agent's input; what it holds is parsed and capped by the service's own code
(`act.plan.snooze_value`, the parser of the snooze tag), so a value means the same on a host as on a tag.
"""

from __future__ import annotations

import os
import stat
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ...act.plan import Snooze, format_cap, snooze_value

from .defaults import DEFAULT_SNOOZE_PATH


def snooze_command(path: str | Path, duration: str = "2h") -> str:
    """The command a person runs on the host to snooze the agent that reads `path`: it names the file unless it
    is the default, so the printed command always reaches the running agent (docs/agent.md's foreground example
    reads /tmp/snooze-until, which a bare `gpufinops agent snooze` would not write)."""
    import shlex

    if str(path) == DEFAULT_SNOOZE_PATH:
        return f"gpufinops agent snooze {duration}"
    return f"gpufinops agent snooze {duration} --snooze-file {shlex.quote(str(path))}"


# An ISO time is 25 characters; anything longer than this is not a snooze someone wrote.
SNOOZE_READ_LIMIT = 4096


def parse_snooze(text: str, written_at: datetime, now: datetime, max_snooze_s: int) -> Snooze:
    """Pure: the snooze one file's text means at `now`, by the service's parser and cap (`act.plan.snooze_value`):
    capped at `max_snooze_s` after the file was written; an unreadable value snoozes for the cap, said."""
    return snooze_value(text.strip(), now, written_at, max_snooze_s, source="snooze file")


def read_snooze(path: str | Path, now: datetime, max_snooze_s: int) -> Snooze:
    """The snooze file's snooze at `now` (`Snooze.active`, `.until`, `.reason`); no file: none."""
    p = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return Snooze(False)
    except OSError as exc:
        return _unreadable(p, exc.strerror or str(exc), now, max_snooze_s)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return _unreadable(p, "not a regular file", now, max_snooze_s)
        data = os.read(fd, SNOOZE_READ_LIMIT + 1)
    except OSError as exc:
        return _unreadable(p, exc.strerror or str(exc), now, max_snooze_s)
    finally:
        os.close(fd)
    if len(data) > SNOOZE_READ_LIMIT:
        return _unreadable(p, f"longer than {SNOOZE_READ_LIMIT} bytes", now, max_snooze_s)
    written_at = datetime.fromtimestamp(st.st_mtime, timezone.utc)
    return parse_snooze(data.decode("utf-8", errors="replace")[:200], written_at, now, max_snooze_s)


def _unreadable(p: Path, why: str, now: datetime, max_snooze_s: int) -> Snooze:
    # Cannot tell whether someone asked to keep it running: the safe side is "snoozed", and it is said.
    until = now + timedelta(seconds=max_snooze_s)
    return Snooze(True, f"snooze file {p} unreadable ({why}): treated as snoozed", capped=True, until=until)


def snooze_until(duration_s: int, now: datetime, max_snooze_s: int) -> tuple[datetime, str]:
    """Pure: when a `snooze DURATION` ends, capped, and a note when it was capped."""
    if duration_s > max_snooze_s:
        return now + timedelta(seconds=max_snooze_s), f"capped at the maximum of {format_cap(max_snooze_s)}"
    return now + timedelta(seconds=duration_s), ""


def write_snooze(path: str | Path, until: datetime) -> None:
    """Write atomically (a reader never sees half a time)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".snooze-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(until.astimezone(timezone.utc).isoformat(timespec="seconds") + "\n")
        os.chmod(tmp, 0o664)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def clear_snooze(path: str | Path) -> bool:
    """Remove the file; False when there was none."""
    try:
        Path(path).unlink()
    except FileNotFoundError:
        return False
    return True
