"""What blocks a stop on the host itself: people typing in a session, allow-listed processes. Each returns reasons.

Both read the kernel's and login's own records, from roots a test can point elsewhere:
- sessions: the utmp file (/var/run/utmp, what `who -u` reads) and the idle time of each session's terminal, the
  access time of /dev/<line>, which the tty layer moves on input (what `who -u` and `w` show as IDLE);
- processes: /proc/<pid>/comm (the kernel's 15-character process name, so `jupyter-lab` matches, and a configured
  longer name is compared on its first 15 characters).
A record that cannot be read blocks nothing by itself, but is said in the reason list of the caller's log.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

# struct utmp on Linux (glibc, 64-bit and 32-bit alike: ut_tv is two int32): type, pid, line[32], id[4], user[32],
# host[256], exit (2 x short), session, tv_sec, tv_usec, addr_v6[4], unused[20] = 384 bytes.
UTMP_FORMAT = "<hxxi32s4s32s256shhiii16s20s"
UTMP_SIZE = struct.calcsize(UTMP_FORMAT)
USER_PROCESS = 7
COMM_LEN = 15  # TASK_COMM_LEN - 1


@dataclass(frozen=True)
class Session:
    user: str
    line: str  # e.g. "pts/0"
    host: str  # where from ("" = local console)
    pid: int


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def parse_utmp(data: bytes) -> list[Session]:
    """Pure: the logged-in sessions (USER_PROCESS records) of a utmp file's bytes; a torn last record is ignored."""
    out = []
    for offset in range(0, len(data) - UTMP_SIZE + 1, UTMP_SIZE):
        fields = struct.unpack_from(UTMP_FORMAT, data, offset)
        ut_type, pid, line, _id, user, host = fields[:6]
        if ut_type == USER_PROCESS and _text(user):
            out.append(Session(_text(user), _text(line), _text(host), pid))
    return out


def utmp_record(user: str, line: str, host: str, pid: int, login_time: int = 0) -> bytes:
    """One USER_PROCESS record in utmp's layout (what login/sshd write; the tests write a utmp file with it)."""
    return struct.pack(UTMP_FORMAT, USER_PROCESS, pid, line.encode(), line[-4:].encode(), user.encode(),
                       host.encode(), 0, 0, 0, login_time, 0, b"", b"")


def _escape(text: str, limit: int = 40) -> str:
    # User names, hosts and process names are others' text: printable and short in a log line or a message.
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean[:limit]


def recent_input_sessions(utmp_path: str | Path, dev_root: str | Path, proc_root: str | Path, *, now: float,
                          within_s: int) -> list[str]:
    """One reason per live logged-in session whose terminal had input in the last `within_s` seconds."""
    if within_s <= 0:
        return []
    try:
        sessions = parse_utmp(Path(utmp_path).read_bytes())
    except OSError:
        return []  # no utmp (a container, a minimal image): nobody is logged in as far as login knows
    reasons = []
    for s in sessions:
        if s.pid > 0 and not Path(proc_root, str(s.pid)).exists():
            continue  # a stale record left by a session that died without logging out
        if not s.line or ".." in s.line:
            continue
        try:
            idle_s = max(0.0, now - os.stat(Path(dev_root, s.line)).st_atime)
        except OSError:
            continue
        if idle_s < within_s:
            where = f" from {_escape(s.host)}" if s.host else ""
            reasons.append(f"user {_escape(s.user)} on {_escape(s.line)}{where} typed {idle_s / 60:.0f} min ago "
                           f"(less than {within_s / 60:.0f} min)")
    return reasons


def running_allowlisted(proc_root: str | Path, names: Iterable[str]) -> list[str]:
    """One reason per configured process name that is running (read from /proc/<pid>/comm)."""
    wanted = {n[:COMM_LEN]: n for n in names}
    if not wanted:
        return []
    found: dict[str, int] = {}
    try:
        entries = list(os.scandir(proc_root))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            comm = Path(entry.path, "comm").read_text(errors="replace").strip()
        except OSError:
            continue  # the process ended while we looked
        if comm in wanted:
            found[comm] = found.get(comm, 0) + 1
    return [f"process {wanted[c]} is running ({n} process{'es' if n > 1 else ''})" for c, n in sorted(found.items())]


def boot_time(proc_root: str | Path) -> float | None:
    """Unix time the host booted (`btime` in /proc/stat), None when unreadable."""
    try:
        for line in Path(proc_root, "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None
