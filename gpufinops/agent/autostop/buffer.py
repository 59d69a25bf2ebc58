"""The host's own GPU samples in SQLite (WAL), a ring buffer as long as the longest rule window plus a margin.

One row per sample per GPU key ("0", or "0/2" for MIG GPU instance 2 of GPU 0, as the central collector names
them), and one gap row (gpu = "") for a sample attempt that could not read the GPU. The file outlives the agent
process, so an agent restart does not reset the idle window; a reboot does (rows older than the boot time are not
read, see `window_usage`), as a person starting the machine again is a sign of use.

`window_usage` is pure: rows in, the `InstanceUsage` that `decide.evaluate` judges out. A gap or a wedged sampler
is missing data: coverage drops, or the usage carries an error, and evaluate says UNKNOWN.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ...collect.gpu_snapshot import HostSnapshot
from ...model import GpuWindowStats, InstanceUsage, format_duration

GAP = ""  # the gpu key of a failed sample attempt

_SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    t REAL NOT NULL,            -- unix seconds of the sample attempt
    gpu TEXT NOT NULL,          -- "0", "0/2" (MIG GPU instance), or "" for a failed attempt
    activity_pct REAL,          -- NULL = not measured (MIG without an activity figure, [N/A])
    memory_mib REAL,
    power_w REAL,
    processes INTEGER,          -- compute processes; NULL = not read
    reason TEXT                 -- why the attempt failed (gap rows only)
);
CREATE INDEX IF NOT EXISTS samples_t ON samples (t);
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- The audit trail of this host's own changes: one row per intent, written before the mutating call and settled
-- after it (done, failed, unknown), so a crash in between leaves a row that says a request may have gone out.
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,           -- unix seconds the intent was written (just before the call)
    kind TEXT NOT NULL,         -- stop
    how TEXT NOT NULL,          -- "EC2 StopInstances on i-… (region)", "command systemctl poweroff"
    reason TEXT NOT NULL,       -- why (the rule's verdict)
    status TEXT NOT NULL,       -- pending (sent, outcome not recorded), done, failed, unknown
    detail TEXT NOT NULL DEFAULT '',
    settled_at REAL
);
"""


@dataclass(frozen=True)
class ActionRow:
    id: int
    at: float
    kind: str
    how: str
    reason: str
    status: str
    detail: str
    settled_at: float | None


@dataclass(frozen=True)
class SampleRow:
    t: float
    gpu: str
    activity_pct: float | None = None
    memory_mib: float | None = None
    power_w: float | None = None
    processes: int | None = None
    reason: str = ""

    @property
    def is_gap(self) -> bool:
        return self.gpu == GAP


def rows_from_snapshot(snapshot: HostSnapshot | None, reason: str, t: float) -> list[SampleRow]:
    """Pure: the rows one sample attempt adds. No snapshot, or one without GPUs, is one gap row."""
    if snapshot is None or not snapshot.gpus:
        return [SampleRow(t, GAP, reason=reason or "no GPU in the answer")]
    rows = []
    for gpu in snapshot.gpus:
        if gpu.mig_instances:
            # Each GPU instance owns its memory and its processes; board power is not split per instance.
            for mi in gpu.mig_instances:
                rows.append(SampleRow(t, f"{gpu.index}/{mi.gpu_instance_id}", mi.activity_pct, mi.memory_used_mib,
                                      None, None if mi.processes is None else len(mi.processes)))
        else:
            rows.append(SampleRow(t, str(gpu.index), gpu.utilization_pct, gpu.memory_used_mib, gpu.power_w,
                                  None if gpu.processes is None else len(gpu.processes)))
    return rows


def physical_gpus(rows: Iterable[SampleRow]) -> set[str]:
    return {r.gpu.split("/", 1)[0] for r in rows if not r.is_gap}


_age = format_duration


def window_usage(rows: Sequence[SampleRow], *, instance_id: str, window_s: int, interval_s: float, now: float,
                 since: float = 0.0, max_age_s: float | None = None) -> InstanceUsage:
    """Pure: the InstanceUsage of the window (now - window_s, now], reading only rows at or after `since` (boot).

    The GPU must be readable now: when the latest attempt failed, or no attempt is more recent than `max_age_s`
    (default 3 intervals: the sampler is wedged or the agent was down), the usage carries an error, whatever the
    coverage of the rest of the window, so evaluate says UNKNOWN and nothing is stopped on old data."""
    in_window = [r for r in rows if now - window_s < r.t <= now and r.t >= since]
    expected = max(1, round(window_s / interval_s))
    max_age = max_age_s if max_age_s is not None else 3 * interval_s
    if not in_window:
        return InstanceUsage(instance_id, window_s, expected, error="no GPU sample in the window yet")
    latest = max(in_window, key=lambda r: r.t)
    latest_attempt = [r for r in in_window if r.t == latest.t]
    if all(r.is_gap for r in latest_attempt):
        return InstanceUsage(instance_id, window_s, expected,
                             error=f"the GPU could not be read {_age(now - latest.t)} ago: {latest.reason}")
    if now - latest.t > max_age:
        return InstanceUsage(instance_id, window_s, expected,
                             error=f"no GPU sample for {_age(now - latest.t)} (sampler stuck or agent down)")
    by_gpu: dict[str, list[SampleRow]] = {}
    for r in in_window:
        if not r.is_gap:
            by_gpu.setdefault(r.gpu, []).append(r)
    return InstanceUsage(instance_id, window_s, expected, gpus=tuple(_stats(gpu, by_gpu[gpu]) for gpu in sorted(by_gpu)))


def _stats(gpu: str, rows: Sequence[SampleRow]) -> GpuWindowStats:
    activity = [r.activity_pct for r in rows if r.activity_pct is not None]
    memory = [r.memory_mib for r in rows if r.memory_mib is not None]
    power = [r.power_w for r in rows if r.power_w is not None]
    processes = [r.processes for r in rows if r.processes is not None]
    return GpuWindowStats(
        gpu=gpu,
        samples=len(activity),
        activity_max=max(activity) if activity else None,
        activity_mean=sum(activity) / len(activity) if activity else None,
        activity_min=min(activity) if activity else None,
        # A MIG instance's only activity figure is its GPM graphics-engine activity (NVML GPM, Hopper and newer).
        activity_signal="NVML GPM graphics engine activity" if "/" in gpu else "nvidia-smi utilization.gpu",
        fb_used_max_mib=max(memory) if memory else None,
        power_mean_w=sum(power) / len(power) if power else None,
        processes_max=max(processes) if processes else None,
        process_samples=len(processes),
    )


class RingBuffer:
    """The SQLite file: samples and the autostop state. Safe to share between the sampler and the loop thread."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=10)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:  # not writable, not a database: a clear error, never a traceback
            raise OSError(f"{self.path}: cannot open the autostop database: {exc}") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, rows: Sequence[SampleRow]) -> None:
        with self._lock:
            self._db.executemany(
                "INSERT INTO samples (t, gpu, activity_pct, memory_mib, power_w, processes, reason) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(r.t, r.gpu, r.activity_pct, r.memory_mib, r.power_w, r.processes, r.reason or None) for r in rows])

    def rows_since(self, t: float) -> list[SampleRow]:
        with self._lock:
            cur = self._db.execute(
                "SELECT t, gpu, activity_pct, memory_mib, power_w, processes, reason FROM samples "
                "WHERE t >= ? ORDER BY t", (t,))
            return [SampleRow(t_, g, a, m, p, n, reason or "") for t_, g, a, m, p, n, reason in cur.fetchall()]

    def prune(self, keep_after: float) -> int:
        """Delete samples older than `keep_after`; how many went."""
        with self._lock:
            return self._db.execute("DELETE FROM samples WHERE t < ?", (keep_after,)).rowcount

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT count(*) FROM samples").fetchone()[0]

    def record_intent(self, kind: str, how: str, reason: str, at: float) -> int:
        """The intent row, written (and committed: autocommit) before the mutating call; its id."""
        with self._lock:
            return self._db.execute("INSERT INTO actions (at, kind, how, reason, status) VALUES (?, ?, ?, ?, 'pending')",
                                    (at, kind, how, reason)).lastrowid

    def settle(self, action_id: int, status: str, detail: str, at: float) -> None:
        with self._lock:
            self._db.execute("UPDATE actions SET status = ?, detail = ?, settled_at = ? WHERE id = ?",
                             (status, detail, at, action_id))

    def actions(self, status: str | None = None) -> list[ActionRow]:
        with self._lock:
            cur = self._db.execute("SELECT id, at, kind, how, reason, status, detail, settled_at FROM actions "
                                   + ("WHERE status = ? " if status else "") + "ORDER BY id",
                                   (status,) if status else ())
            return [ActionRow(*r) for r in cur.fetchall()]

    def load_state(self, key: str) -> dict | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def save_state(self, key: str, value: dict) -> None:
        with self._lock:
            self._db.execute("INSERT INTO state (key, value) VALUES (?, ?) "
                             "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, json.dumps(value)))
