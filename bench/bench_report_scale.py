"""The monthly report at 10,000 GPUs x 30 days (issue 29, item 4), and the raw decision window per instance-week.

    python bench/bench_report_scale.py --gpus 10000 --days 30 [--db PATH] [--keep]
    python bench/bench_report_scale.py --check                 # stretch build == per-tick build, small fleet
    python bench/bench_report_scale.py --raw-week --gpus 200   # raw rows per instance-week, every tick vs compact
    python bench/bench_report_scale.py --raw-demo              # the same on the demo's real pipeline run
    python bench/bench_report_scale.py --by-tick ...           # the month through Store.record_decisions instead

The month: gpus / 8 instances of p4d.24xlarge (10,000 GPUs = 1,250 instances), the two shipped rules, one tick
a minute, each instance's verdicts drawn as stretches with bench_report.py's mix (ACTIVE 45 %, UNDERUTILIZED
20 %, IDLE 30 %, UNKNOWN 5 %; 20-180 min means; the second rule calls every other idle stretch underutilized)
and a random activity per tick (numpy).

Recording 10k GPUs x 30 d tick by tick through Store.record_decisions is 108 M decisions: ~3 h at the 10k/s
bench_report.py measured, on this 2-core machine. So the month is folded per stretch here into exactly what
the store's fold makes of those ticks (the episodes of each (instance, rule) run of one verdict and code, the
hour aggregates of the ticks resolved per tick, each instance's tail, the service run) and written through
gpufinops.store.rollups.write_folded, the write half of Store.record_decisions. `--check` builds a small
fleet both ways (per stretch, and tick by tick through Store.record_decisions from the same draws) and
compares every row of the four tables the report reads.

Then `gpufinops report --month` is timed as its own process (wall, CPU, peak RSS from os.wait4); yardstick in
the same run: SQLite's single pass over the rows the report reads (bench_report.sqlite_pass).
"""

from __future__ import annotations

import argparse
import math
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_report import MONTH, STATES, sqlite_pass, table_sizes  # noqa: E402
from gpufinops.config import DEFAULT_RULES_DIR  # noqa: E402
from gpufinops.model import Decision, ReasonCode, Verdict  # noqa: E402
from gpufinops.rules import load_rules  # noqa: E402
from gpufinops.store.episodes import Episode, Heads, HourAgg, Run, Tail  # noqa: E402
from gpufinops.store.rollups import write_folded  # noqa: E402
from gpufinops.store.store import Store  # noqa: E402

START = datetime(2026, 10, 1)  # naive UTC, as the fold sees evaluated_at
ITYPE, GPUS_PER, PRICE = "p4d.24xlarge", 8, 32.77
GAP_S = 120  # 2 x the tick
# Outcomes (verdict, code) of the two rules: 0-3 the four STATES under rule A, 4-7 under rule B, 8 = rule B's
# underutilized call of an odd idle stretch.
OUTCOMES = ([(s[0], s[1]) for s in STATES] + [(s[0], s[2]) for s in STATES]
            + [(Verdict.UNDERUTILIZED, ReasonCode.LOW_STEADY)])
IDLE_STATE = next(i for i, s in enumerate(STATES) if s[0] is Verdict.IDLE)
UNKNOWN_STATE = next(i for i, s in enumerate(STATES) if s[0] is Verdict.UNKNOWN)


def fleet(gpus: int) -> list[tuple[str, str]]:
    """(instance_id, team): p4d.24xlarge of 8 GPUs each."""
    return [(f"i-{n:05d}", f"team-{n % 12}") for n in range(math.ceil(gpus / GPUS_PER))]


def draw(rng: np.random.Generator, minutes: int):
    """One instance's month: per minute its rule-A and rule-B outcome ids and its activity (NaN = unknown)."""
    weights = np.array([s[3] for s in STATES])
    means = np.array([s[4] for s in STATES], dtype=float)
    states, lengths, total = [], [], 0
    while total < minutes:
        s = rng.choice(len(STATES), size=512, p=weights / weights.sum())
        n = np.maximum(1, rng.exponential(means[s]).astype(np.int64))
        states.append(s)
        lengths.append(n)
        total += int(n.sum())
    s, n = np.concatenate(states), np.concatenate(lengths)
    stretch = np.repeat(np.arange(len(s)), n)[:minutes]
    state = s[stretch]
    a = state
    b = np.where((state == IDLE_STATE) & (stretch % 2 == 1), 8, state + 4)
    act = rng.random(minutes) * np.where(state == IDLE_STATE, 3.0, 60.0)
    act[state == UNKNOWN_STATE] = np.nan
    return a, b, act


def row_of(iid: str, team: str, outcome: int, act: float, at: datetime) -> dict:
    """The decision row the pipeline would store for that tick (what Episode.settle and tails read)."""
    v, _ = OUTCOMES[outcome]
    known = not math.isnan(act)
    return {"reason": f"{v.value.lower()}: max {act if known else 0:.1f}% over 2 h", "window_s": 7200,
            "activity_mean": act if known else None, "activity_max": act * 1.5 if known else None,
            "memory_max_mib": 20000.0 if known else None, "coverage": 1.0, "hourly_cost": PRICE, "team": team,
            "instance_type": ITYPE, "evaluated_at": at}


def fold_instance(iid: str, team: str, rules: list[str], a, b, act, heads: Heads, hours: dict) -> None:
    """What Store.record_decisions' fold makes of this instance's ticks (one a minute from START, none missed)."""
    minutes = len(a)
    at = lambda m: START + timedelta(minutes=int(m))  # noqa: E731
    for rule, o in ((rules[0], a), (rules[1], b)):
        starts = np.flatnonzero(np.r_[True, o[1:] != o[:-1]])
        ends = np.r_[starts[1:] - 1, minutes - 1]
        for s, e in zip(starts.tolist(), ends.tolist()):
            v, code = OUTCOMES[int(o[s])]
            heads.new_episodes.append(Episode(iid, rule, v.value, code.value, at(s), at(e), e - s + 1, "", "", None,
                                              None, None, True, latest=row_of(iid, team, int(o[e]), act[e], at(e))))
    # Rules resolved per tick: rule B wins only where it says UNDERUTILIZED against rule A's IDLE (least idle
    # first; a tie keeps rule A's row, the first).
    res = np.where(b == 8, 8, a)
    last = minutes - 1
    lv, lc = OUTCOMES[int(res[last])]
    known = not math.isnan(act[last])
    heads.tails[iid] = Tail(iid, at(last), lv.value, lc.value, PRICE, team, ITYPE, act[last] if known else None,
                            act[last] * 1.5 if known else None, 20000.0 if known else None, 2)
    heads.changed_tails.add(iid)
    # Every other tick is rolled up: 60 s in its own hour (ticks on the minute, the next one 60 s later).
    m = np.arange(last)
    key = (m // 60) * 16 + res[:last]
    order = np.argsort(key, kind="stable")
    k = key[order]
    first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    counts = np.diff(np.r_[first, len(k)])
    acts = act[:last][order]
    sums = np.add.reduceat(np.nan_to_num(acts), first)
    maxes = np.fmax.reduceat(acts, first)
    for kk, n, sm, mx in zip(k[first].tolist(), counts.tolist(), sums.tolist(), maxes.tolist()):
        hour, outcome = divmod(kk, 16)
        v, code = OUTCOMES[outcome]
        measured = not math.isnan(mx)
        hours[(START + timedelta(hours=hour), iid, v.value, code.value, measured, PRICE, team, ITYPE)] = HourAgg(
            n / 60.0, n, 2 * n, sm / 60.0, mx * 1.5 if measured else None, 20000.0 if measured else None, 0.0)


def build_stretches(store: Store, gpus: int, days: float, seed: int = 13, batch: int = 50) -> int:
    """The month per stretch, written through write_folded `batch` instances per transaction. Returns ticks."""
    rules = [r.name for r in load_rules([str(DEFAULT_RULES_DIR)])][:2]
    minutes = int(days * 1440)
    rng = np.random.default_rng(seed)
    insts = fleet(gpus)
    for i in range(0, len(insts), batch):
        heads, hours = Heads(), {}
        if i == 0:
            heads.new_runs.append(Run(START, START + timedelta(minutes=minutes - 1), minutes))
        for iid, team in insts[i:i + batch]:
            fold_instance(iid, team, rules, *draw(rng, minutes), heads, hours)
        with store.engine.begin() as conn:
            write_folded(conn, heads, hours)
    return minutes * len(insts) * 2


def build_ticks(store: Store, gpus: int, days: float, seed: int = 13, raw_every_s: float | None = 3600,
                raw_days: float = 7) -> int:
    """The same draws recorded tick by tick through Store.record_decisions, an hour of ticks per call."""
    rules = [r.name for r in load_rules([str(DEFAULT_RULES_DIR)])][:2]
    minutes = int(days * 1440)
    rng = np.random.default_rng(seed)
    insts = fleet(gpus)
    draws = {iid: draw(rng, minutes) for iid, _ in insts}
    teams = {iid: team for iid, team in insts}
    types = {iid: ITYPE for iid, _ in insts}
    batch, n = [], 0
    for t in range(minutes):
        at = START + timedelta(minutes=t)
        for iid, _ in insts:
            a, b, act = draws[iid]
            x = float(act[t])
            known = not math.isnan(x)
            for rule, o in ((rules[0], int(a[t])), (rules[1], int(b[t]))):
                v, code = OUTCOMES[o]
                batch.append(Decision(iid, rule, v, code, f"{v.value.lower()}: max {x if known else 0:.1f}% over 2 h",
                                      at, window_s=7200, activity_mean=x if known else None,
                                      activity_max=x * 1.5 if known else None,
                                      memory_max_mib=20000.0 if known else None, coverage=1.0, hourly_cost=PRICE))
        if (t + 1) % 60 == 0 or t == minutes - 1:
            store.record_decisions(f"bench-{t}", batch, dry_run=True, teams=teams, types=types, max_gap_s=GAP_S,
                                   raw_keep_s=raw_days * 86400, raw_every_s=raw_every_s)
            n += len(batch)
            batch = []
    return n


def rows(db: Path, table: str, order: str) -> list[tuple]:
    con = sqlite3.connect(db)
    cols = [r[1] for r in con.execute(f"pragma table_info({table})") if r[1] != "id"]
    out = con.execute(f"select {', '.join(cols)} from {table} order by {order}").fetchall()
    con.close()
    return out


def same(x: list[tuple], y: list[tuple]) -> bool:
    def eq(p, q):
        if isinstance(p, float) and isinstance(q, float):
            return math.isclose(p, q, rel_tol=1e-9, abs_tol=1e-9)
        return p == q
    return len(x) == len(y) and all(len(r) == len(s) and all(map(eq, r, s)) for r, s in zip(x, y))


def check(tmp: Path) -> int:
    """A small fleet built both ways: every row of episodes, rollups, tails and runs the same."""
    a, b = tmp / "stretches.db", tmp / "ticks.db"
    for db, build in ((a, build_stretches), (b, build_ticks)):
        store = Store(f"sqlite:///{db}")
        build(store, 40, 1.5)
        store.close()
    bad = 0
    for table, order in (("verdict_episodes", "instance_id, rule, started_at"),
                         ("verdict_hours", "hour, instance_id, verdict, code"), ("verdict_tails", "instance_id"),
                         ("service_runs", "started_at")):
        x, y = rows(a, table, order), rows(b, table, order)
        ok = same(x, y)
        bad += not ok
        print(f"check {table}: {len(x):,} rows per stretch, {len(y):,} tick by tick: {'equal' if ok else 'DIFFER'}")
    return int(bad > 0)


def raw_week(tmp: Path, gpus: int) -> int:
    """One week tick by tick with every raw row kept, and with the compact window: raw bytes per instance-week."""
    n_inst = len(fleet(gpus))
    for label, every in (("every tick", None), ("changes + hourly heartbeat", 3600)):
        db = tmp / f"week-{every}.db"
        store = Store(f"sqlite:///{db}")
        t0 = time.perf_counter()
        c0 = time.process_time()
        n = build_ticks(store, gpus, 7, raw_every_s=every, raw_days=7)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        store.close()
        con = sqlite3.connect(db)
        con.execute("pragma wal_checkpoint(truncate)")
        raw_rows = con.execute("select count(*) from decisions").fetchone()[0]
        con.close()
        sizes = table_sizes(db)
        raw = sum(v for k, v in sizes.items() if k == "decisions" or k.startswith("ix_decisions"))
        print(f"{label}: {n:,} decisions of {n_inst} instances x 7 d recorded in {wall:.0f} s wall, {cpu:.0f} CPU-s; "
              f"raw rows {raw_rows:,} ({raw_rows / n:.2%}); raw table + indexes {raw / 2**20:.2f} MiB = "
              f"{raw / 2**20 / n_inst:.3f} MiB per instance-week; database {db.stat().st_size / 2**20:.1f} MiB")
    return 0


def raw_demo(tmp: Path) -> int:
    """The demo's real pipeline (`gpufinops demo --no-compare`: 12 instances, 2 rules, a tick every 120 s of
    the trace) with every raw row and with the compact window: raw bytes per instance-week."""
    import io

    from gpufinops.config import load_settings
    from gpufinops.demo.run import run_demo

    act = {"dry_run": False, "max_stops_per_run": 5, "max_stops_fraction": 0.5}  # run_demo's own
    for label, every in (("every tick", 0), ("changes + hourly heartbeat", 3600)):
        db = tmp / f"demo-{every}.db"
        summary = run_demo(out=io.StringIO(), db_path=str(db), quiet=True, compare=False,
                           settings=load_settings(act=act, store={"raw_decisions_every_s": every}))
        con = sqlite3.connect(db)
        con.execute("pragma wal_checkpoint(truncate)")
        raw_rows = con.execute("select count(*) from decisions").fetchone()[0]
        n = sum(con.execute(f"select sum(evaluations) from {t}").fetchone()[0]
                for t in ("verdict_hours", "verdict_tails"))
        n_inst = con.execute("select count(distinct instance_id) from verdict_episodes").fetchone()[0]
        con.close()
        sizes = table_sizes(db)
        raw = sum(v for k, v in sizes.items() if k == "decisions" or k.startswith("ix_decisions"))
        weeks = summary.simulated_hours / 168
        print(f"demo, {label}: {n:,} decisions of {n_inst} instances x {summary.simulated_hours:.1f} h; raw rows "
              f"{raw_rows:,} ({raw_rows / n:.2%}); raw table + indexes {raw / 2**20:.3f} MiB = "
              f"{raw / 2**20 / n_inst / weeks:.3f} MiB per instance-week")
    return 0


def run_report(db: Path, out: Path) -> tuple[float, float, float, int]:
    """Wall seconds, CPU seconds, peak RSS (MiB) and exit code of `gpufinops report` as its own process."""
    cmd = [sys.executable, "-c", "import sys; from gpufinops.cli import main; sys.exit(main())",
           "report", "--month", MONTH, "--db", str(db), "--out-dir", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=out.parent, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0, os.waitstatus_to_exitcode(status)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=10000)
    ap.add_argument("--days", type=float, default=30)
    ap.add_argument("--db", default=None, help="build into (or, if it exists, report on) this SQLite file")
    ap.add_argument("--repeat", type=int, default=1, help="report runs")
    ap.add_argument("--check", action="store_true", help="compare the stretch build with the per-tick build")
    ap.add_argument("--raw-week", action="store_true", help="raw window bytes per instance-week, both ways")
    ap.add_argument("--raw-demo", action="store_true", help="the same on the demo's pipeline run, both ways")
    ap.add_argument("--by-tick", action="store_true",
                    help="build the month tick by tick through Store.record_decisions (10k GPUs: ~45 min at 40k/s)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-report-scale-"))
    if args.check:
        return check(tmp)
    if args.raw_week:
        return raw_week(tmp, args.gpus)
    if args.raw_demo:
        return raw_demo(tmp)
    db = Path(args.db) if args.db else tmp / "audit.db"
    if not db.exists():
        store = Store(f"sqlite:///{db}")
        t0 = time.perf_counter()
        ticks = (build_ticks if args.by_tick else build_stretches)(store, args.gpus, args.days)
        store.close()
        print(f"built {args.gpus:,} GPUs = {len(fleet(args.gpus)):,} instances x 2 rules x {args.days:g} d, one tick "
              f"a minute ({ticks:,} decisions) in {time.perf_counter() - t0:.0f} s")
    con = sqlite3.connect(db)
    con.execute("pragma wal_checkpoint(truncate)")
    counts = {t: con.execute(f"select count(*) from {t}").fetchone()[0]
              for t in ("verdict_episodes", "verdict_hours", "verdict_tails", "service_runs")}
    con.close()
    print("rows: " + ", ".join(f"{t} {n:,}" for t, n in counts.items())
          + f"; database {db.stat().st_size / 2**20:,.0f} MiB")
    rc = 0
    for i in range(args.repeat):
        wall, cpu, rss, rc = run_report(db, tmp / f"out{i}")
        yard_s, yard_rows = sqlite_pass(db)
        print(f"gpufinops report --month {MONTH}: {wall:.1f} s wall, {cpu:.1f} CPU-s, peak RSS {rss:,.0f} MiB, "
              f"exit {rc}; yardstick (SQLite's single pass over the {yard_rows:,} rows read): {yard_s:.2f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
