"""The monthly report on a month of a fleet, recorded through the store the pipeline writes to.

    python bench/bench_report.py --gpus 1000 --days 30 [--raw-days 7] [--db PATH]

1. Builds the month: synthetic decisions for gpus x 0.15 instances (p4d.24xlarge x 8 GPUs and g5.12xlarge x 4,
   so 1,000 GPUs = 150 instances) under the two shipped rules, one tick a minute, recorded with
   Store.record_decisions (the method gpufinops.pipeline calls each tick; here an hour of ticks per call, so
   generation is not the bottleneck), raw rows kept for --raw-days as the service does.
2. Times `gpufinops report --month ...` as a whole child process, with its peak RSS (os.wait4).
3. Yardstick in the same run: SQLite's own single pass over the rollup and episode rows the report reads.
4. Prints the database size, per table where SQLite's dbstat is compiled in, and per GPU-month.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpufinops.config import DEFAULT_RULES_DIR  # noqa: E402
from gpufinops.model import Decision, ReasonCode, Verdict  # noqa: E402
from gpufinops.rules import load_rules  # noqa: E402
from gpufinops.store.store import Store  # noqa: E402

START = datetime(2026, 10, 1, tzinfo=timezone.utc)
MONTH = "2026-10"
TICK_S = 60
TYPES = (("p4d.24xlarge", 8, 32.77), ("g5.12xlarge", 4, 5.672))
# Verdict stretches: (verdict, code of the default rule, code of the zero-activity rule), weights, mean minutes.
STATES = [
    (Verdict.ACTIVE, ReasonCode.BUSY, ReasonCode.BUSY, 0.45, 180),
    (Verdict.UNDERUTILIZED, ReasonCode.BURSTY_LOW, ReasonCode.BURSTY_LOW, 0.20, 90),
    (Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, ReasonCode.MEMORY_HELD_IDLE, 0.30, 150),
    (Verdict.UNKNOWN, ReasonCode.NO_SERIES, ReasonCode.NO_SERIES, 0.05, 20),
]


def fleet(gpus: int) -> list[tuple[str, str, int, float, str]]:
    """(instance_id, type, gpus, $/h, team) adding up to `gpus` GPUs."""
    out, left, n = [], gpus, 0
    while left > 0:
        itype, g, price = TYPES[0] if n % 3 != 2 else TYPES[1]
        if g > left:
            itype, g, price = TYPES[1]
        out.append((f"i-{n:05d}", itype, g, price, f"team-{n % 12}"))
        left -= g
        n += 1
    return out


class Timeline:
    """One instance's verdict stretches, drawn lazily minute by minute."""

    def __init__(self, rnd: random.Random):
        self.rnd, self.left, self.state, self.episode = rnd, 0, STATES[0], 0

    def next(self):
        if self.left <= 0:
            self.state = self.rnd.choices(STATES, weights=[s[3] for s in STATES])[0]
            self.left = max(1, int(self.rnd.expovariate(1 / self.state[4])))
            self.episode += 1
        self.left -= 1
        return self.state, self.episode


def build(store: Store, gpus: int, days: float, raw_days: float) -> int:
    rnd = random.Random(13)
    names = [r.name for r in load_rules([str(DEFAULT_RULES_DIR)])][:2]
    insts = fleet(gpus)
    lines = {i[0]: Timeline(rnd) for i in insts}
    teams = {i[0]: i[4] for i in insts}
    types = {i[0]: i[1] for i in insts}
    ticks = int(days * 86400 // TICK_S)
    n_rows, batch = 0, []
    for t in range(ticks):
        at = START + timedelta(seconds=t * TICK_S)
        for iid, itype, g, price, team in insts:
            (verdict, code_a, code_b, _, _), episode = lines[iid].next()
            unknown = verdict is Verdict.UNKNOWN
            act = None if unknown else (rnd.random() * (3 if verdict is Verdict.IDLE else 60))
            # The zero-activity rule calls every other idle stretch underutilized (memory held, some activity).
            verdict_b = Verdict.UNDERUTILIZED if verdict is Verdict.IDLE and episode % 2 else verdict
            code_b = ReasonCode.LOW_STEADY if verdict_b is not verdict else code_b
            for rule, v, code in ((names[0], verdict, code_a), (names[-1], verdict_b, code_b)):
                batch.append(Decision(iid, rule, v, code, f"{v.value.lower()}: max {act or 0:.1f}% over 2 h", at,
                                      window_s=7200, activity_mean=act, activity_max=None if unknown else act * 1.5,
                                      memory_max_mib=None if unknown else 20000.0, coverage=1.0, hourly_cost=price))
        if (t + 1) % 60 == 0 or t == ticks - 1:  # an hour of ticks per call
            store.record_decisions(f"bench-{t}", batch, dry_run=True, teams=teams, types=types,
                                   max_gap_s=2 * TICK_S, raw_keep_s=raw_days * 86400)
            n_rows += len(batch)
            batch = []
    return n_rows


def run_report(db: Path, out: Path) -> tuple[float, float, int]:
    """Wall seconds, peak RSS (MiB) and exit code of `gpufinops report` as its own process."""
    cmd = [sys.executable, "-c", "import sys; from gpufinops.cli import main; sys.exit(main())",
           "report", "--month", MONTH, "--db", str(db), "--out-dir", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=out.parent, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    return wall, usage.ru_maxrss / 1024.0, os.waitstatus_to_exitcode(status)


def sqlite_pass(db: Path) -> tuple[float, int]:
    """SQLite alone reading the rows the report reads (rollups, tails, episodes, runs of the month)."""
    con = sqlite3.connect(db)
    lo, hi = "2026-10-01 00:00:00", "2026-11-01 00:00:00"
    t0 = time.perf_counter()
    n = 0
    for q in ("select count(*), sum(hours), sum(activity_hours), max(activity_max), max(memory_max_mib) "
              "from verdict_hours where hour >= ? and hour < ?",
              "select count(*), max(evaluations) from verdict_tails where at >= ? and at < ?",
              "select count(*), sum(ticks), max(length(rule)) from verdict_episodes "
              "where last_seen_at >= ? and started_at < ?",
              "select count(*), sum(ticks) from service_runs where last_seen_at >= ? and started_at < ?"):
        n += con.execute(q, (lo, hi)).fetchone()[0]
    wall = time.perf_counter() - t0
    con.close()
    return wall, n


def table_sizes(db: Path) -> dict[str, int]:
    con = sqlite3.connect(db)
    try:
        rows = con.execute("select name, sum(pgsize) from dbstat group by name").fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        con.close()
    return dict(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--days", type=float, default=30)
    ap.add_argument("--raw-days", type=float, default=7, help="raw decision rows kept (store.raw_decisions_days)")
    ap.add_argument("--db", default=None, help="build into this SQLite file (default: a temporary folder)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-report-"))
    db = Path(args.db) if args.db else tmp / "audit.db"
    store = Store(f"sqlite:///{db}")
    t0 = time.perf_counter()
    rows = build(store, args.gpus, args.days, args.raw_days)
    build_s = time.perf_counter() - t0
    store.close()
    con = sqlite3.connect(db)
    con.execute("pragma wal_checkpoint(truncate)")
    counts = {t: con.execute(f"select count(*) from {t}").fetchone()[0]
              for t in ("decisions", "verdict_episodes", "verdict_hours", "verdict_tails", "service_runs")}
    con.close()
    size = db.stat().st_size
    sizes = table_sizes(db)
    gpu_months = args.gpus * args.days / 30.0
    print(f"fleet: {args.gpus} GPUs, {len(fleet(args.gpus))} instances, 2 rules, {args.days:g} days, one tick a "
          f"minute: {rows:,} decisions recorded in {build_s:.0f} s ({rows / build_s:,.0f}/s)")
    print("rows: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))
    print(f"database: {size / 2**20:,.1f} MiB = {size / 2**20 / gpu_months:.3f} MiB per GPU-month "
          f"(raw rows kept {args.raw_days:g} days)")
    if sizes:
        raw = sum(v for k, v in sizes.items() if k == "decisions" or k.startswith("ix_decisions"))
        big = sorted(((k, v) for k, v in sizes.items() if v > 2**16), key=lambda kv: -kv[1])
        print("by table (MiB): " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in big))
        print(f"without the raw window: {(size - raw) / 2**20:,.1f} MiB = "
              f"{(size - raw) / 2**20 / gpu_months:.4f} MiB per GPU-month (what a month adds)")
    wall, rss, rc = run_report(db, tmp / "out")
    yard_s, yard_rows = sqlite_pass(db)
    print(f"gpufinops report --month {MONTH}: {wall:.1f} s, peak RSS {rss:,.0f} MiB, exit {rc}")
    print(f"yardstick: SQLite's single pass over the {yard_rows:,} rows the report reads: {yard_s:.2f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
