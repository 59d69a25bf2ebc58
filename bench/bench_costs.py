"""Idle cost from stored decisions: read + price a month of verdicts.

    python bench/bench_costs.py [--decisions 400000 2000000]

Builds a SQLite store with N decisions (instances x 2 rules, one evaluation a minute),
then times, in the same run:
  baseline  Store.decision_rows() (list of dicts) + the original row-by-row verdict_costs
            (kept verbatim below as `rowwise_verdict_costs`)
  gpufinops Store.decision_frame() (one pandas read) + the vectorised costs.verdict_costs
and checks both give the same cost per instance and verdict. Wall time from a plain run, peak
Python memory from a second run under tracemalloc.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
from sqlalchemy import insert

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpufinops.cost.costs import _RANK, hourly_rate, verdict_costs  # noqa: E402
from gpufinops.prices.prices import OnDemandPrices  # noqa: E402
from gpufinops.store.store import Store
from gpufinops.store.schema import decisions  # noqa: E402

START = datetime(2026, 10, 1, tzinfo=timezone.utc)
TYPES = ["g5.xlarge", "p4d.24xlarge", "g6e.xlarge", "p5.48xlarge"]
VERDICT_CYCLE = ["ACTIVE", "IDLE", "UNDERUTILIZED", "IDLE", "UNKNOWN", "ACTIVE"]


def _utc(dt):
    if isinstance(dt, pd.Timestamp):
        dt = dt.to_pydatetime()
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def rowwise_verdict_costs(decision_rows, start, end, *, max_gap_s, rates=None, catalog=None, attrs=None,
                          default_region=""):
    """The original implementation: one hourly_rate() call and one dict per decision."""
    rates, attrs = rates or {}, attrs or {}
    cols = ["instance_id", "team", "project", "account", "instance_type", "verdict", "at", "hours", "rate", "cost"]
    rows = [r for r in decision_rows if start <= _utc(r["evaluated_at"]) < end]
    if not rows:
        return pd.DataFrame({c: [] for c in cols})
    d = pd.DataFrame(rows)
    d["at"] = [_utc(x) for x in d["evaluated_at"]]
    d["rank"] = d["verdict"].map(lambda v: _RANK.get(v, _RANK["UNKNOWN"]))
    d = d.sort_values(["instance_id", "at", "rank"]).drop_duplicates(["instance_id", "at"], keep="first")
    nxt = d.groupby("instance_id")["at"].shift(-1)
    end_ts = pd.Timestamp(end)
    span = (nxt.fillna(end_ts) - d["at"]).dt.total_seconds().clip(lower=0, upper=max_gap_s)
    d["hours"] = span / 3600.0
    out = []
    for r in d.to_dict("records"):
        a = attrs.get(r["instance_id"], {})
        itype = r.get("instance_type") or a.get("instance_type", "")
        hr = hourly_rate(r["instance_id"], itype, a.get("region") or default_region, rates, catalog, r.get("hourly_cost"))
        out.append({
            "instance_id": r["instance_id"], "team": r.get("team") or a.get("team", ""),
            "project": a.get("project", ""), "account": a.get("account", ""), "instance_type": itype,
            "verdict": r["verdict"], "at": r["at"], "hours": r["hours"], "rate": hr.rate,
            "cost": r["hours"] * hr.rate if hr.rate is not None else float("nan"),
        })
    return pd.DataFrame(out, columns=cols)


def build(db: Path, n_decisions: int) -> tuple[str, datetime]:
    url = f"sqlite:///{db}"
    store = Store(url)
    rules = ("gpu-util-below-40pct-10m", "zero-activity-1h")
    instances = max(1, n_decisions // (2 * 60 * 24 * 7))  # a week of minutes per instance
    minutes = n_decisions // (2 * instances)
    batch = []
    with store.engine.begin() as conn:
        for m in range(minutes):
            at = (START + timedelta(minutes=m)).replace(tzinfo=None)
            for i in range(instances):
                itype = TYPES[i % len(TYPES)]
                for k, rule in enumerate(rules):
                    batch.append({"run_id": f"r{m}", "instance_id": f"i-{i:05d}", "rule": rule,
                                  "verdict": VERDICT_CYCLE[(m // 30 + i + k) % len(VERDICT_CYCLE)], "code": "x",
                                  "reason": "bench", "evaluated_at": at, "window_s": 600,
                                  "hourly_cost": None if i % 5 == 0 else 1.0 + i % 7, "team": f"t{i % 9}",
                                  "instance_type": itype, "dry_run": True})
            if len(batch) >= 50_000:
                conn.execute(insert(decisions), batch)
                batch = []
        if batch:
            conn.execute(insert(decisions), batch)
    return url, START + timedelta(minutes=minutes)


def measure(fn):
    """Wall time from a plain run; peak Python memory from a second run under tracemalloc
    (tracemalloc slows Python-heavy code several times, so it must not time anything)."""
    t0 = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - t0
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return result, wall, peak


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decisions", type=int, nargs="+", default=[400_000, 2_000_000])
    args = ap.parse_args(argv)
    catalog = OnDemandPrices.load_default()
    print(f"{'decisions':>10}  {'path':<44} {'wall s':>8} {'peak MiB':>9}")
    for n in args.decisions:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"building {n:,} decisions ...", file=sys.stderr, flush=True)
            url, end = build(Path(tmp) / "bench.db", n)
            store = Store(url)
            kw = dict(max_gap_s=120, catalog=catalog, default_region="us-east-1")
            base, bw, bp = measure(lambda: rowwise_verdict_costs(store.decision_rows(START, end), START, end, **kw))
            new, nw, np_ = measure(lambda: verdict_costs(store.decision_frame(START, end), START, end, **kw))
            a = base.groupby(["instance_id", "verdict"])["cost"].sum()
            b = new.groupby(["instance_id", "verdict"])["cost"].sum()
            same = a.index.equals(b.index) and (a - b).abs().max() < 1e-6
            print(f"{n:>10,}  {'baseline: decision_rows + row-wise pricing':<44} {bw:>8.2f} {bp:>9.0f}")
            print(f"{n:>10,}  {'decision_frame + vectorised verdict_costs':<44} {nw:>8.2f} {np_:>9.0f}"
                  f"   same result: {same}  ({bw / nw:.1f}x faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
