"""Verdict episodes and hourly rollups (gpufinops/episodes.py, Store.record_decisions) count the same time and
money as the per-minute computation over the raw decision rows, to the cent."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest

from gpufinops.cost.costs import idle_cost_report, verdict_costs
from gpufinops.model import Decision, ReasonCode, Verdict
from gpufinops.store.store import Store

T0 = datetime(2026, 10, 1, 0, 0, 30, tzinfo=timezone.utc)  # ticks off the hour: intervals cross hour boundaries
MONTH_START = datetime(2026, 10, 1, tzinfo=timezone.utc)
MONTH_END = datetime(2026, 11, 1, tzinfo=timezone.utc)
CODES = {"ACTIVE": ReasonCode.BUSY, "UNDERUTILIZED": ReasonCode.BURSTY_LOW, "IDLE": ReasonCode.IDLE_STAYS_BELOW,
         "UNKNOWN": ReasonCode.NO_SERIES}
GPUS = {"g5.xlarge": 1, "p4d.24xlarge": 8}


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'g.db'}"
    return request.getfixturevalue("fresh_postgres_db")


def synthetic_ticks(minutes: int, seed: int = 7):
    """Two rules judging four instances every minute, with disagreements, gaps, price and team changes."""
    rnd = random.Random(seed)
    ticks = []
    for m in range(minutes):
        at = T0 + timedelta(minutes=m)
        if 50 <= m < 58:  # the service was down for 8 minutes: a gap longer than max_gap_s
            continue
        ds, teams, types = [], {}, {}
        for n, inst in enumerate(("i-a", "i-b", "i-c", "i-d")):
            if inst == "i-c" and 100 <= m < 130:  # stopped for half an hour
                continue
            base = rnd.choice(["IDLE"] * 5 + ["ACTIVE", "UNDERUTILIZED", "UNKNOWN"])
            other = base if rnd.random() < 0.8 else rnd.choice(list(CODES))
            rate = None if inst == "i-d" else (3.0 if m < 90 else 4.5) * (n + 1)
            for rule, verdict in (("default", base), ("strict", other)):
                unknown = verdict == "UNKNOWN"
                ds.append(Decision(inst, rule, Verdict(verdict), CODES[verdict], f"{verdict} because", at,
                                   activity_mean=None if unknown else rnd.uniform(0, 90),
                                   activity_max=None if unknown else rnd.uniform(50, 100),
                                   memory_max_mib=None if unknown else rnd.uniform(0, 80000),
                                   hourly_cost=rate))
            teams[inst] = "" if inst == "i-b" else ("ml" if m < 70 else "vision")
            types[inst] = "p4d.24xlarge" if inst == "i-a" else "g5.xlarge"
        ticks.append((at, ds, teams, types))
    return ticks


def catalog(itype: str, region: str) -> float | None:
    return {"g5.xlarge": 1.006}.get(itype)


def idle_gpu_hours(vc: pd.DataFrame) -> pd.Series:
    idle = vc[vc["verdict"] == "IDLE"]
    return (idle["hours"] * idle["instance_type"].map(GPUS)).groupby(idle["instance_id"]).sum()


# "now": a report up to now, 47 s after the latest tick (the tails are counted up to it).
@pytest.mark.parametrize("minutes,end", [(240, MONTH_END), (200, T0 + timedelta(minutes=199, seconds=47))],
                         ids=["month", "now"])
def test_rollups_equal_the_per_minute_computation(db_url, minutes, end):
    store = Store(db_url)
    for n, (at, ds, teams, types) in enumerate(synthetic_ticks(minutes)):
        store.record_decisions(f"run{n}", ds, dry_run=True, teams=teams, types=types, max_gap_s=120)
    kw = dict(max_gap_s=120, catalog=catalog, default_region="us-east-1")
    per_minute = verdict_costs(store.decision_frame(MONTH_START, end), MONTH_START, end, **kw)
    for grain in ("hour", "period"):
        rolled = verdict_costs(store.verdict_hours_frame(MONTH_START, end, grain=grain), MONTH_START, end, **kw)
        assert len(rolled) < len(per_minute) / 5  # far fewer rows than decisions, even with random verdicts
        for by in ("instance", "team"):
            a = idle_cost_report(per_minute, by).set_index(by).sort_index()
            b = idle_cost_report(rolled, by).set_index(by).sort_index()
            assert list(a.index) == list(b.index)
            for col in ("active_cost", "underutilized_cost", "unknown_cost", "idle_cost", "total_cost"):
                assert (a[col] - b[col]).abs().max() < 0.005, (grain, by, col)
            assert (a["unpriced_hours"] - b["unpriced_hours"]).abs().max() < 1e-9
        hours = lambda vc: vc.groupby(["instance_id", "verdict"])["hours"].sum()  # noqa: E731
        pd.testing.assert_series_equal(hours(per_minute), hours(rolled), check_exact=False, atol=1e-9)
        pd.testing.assert_series_equal(idle_gpu_hours(per_minute), idle_gpu_hours(rolled), check_exact=False,
                                       atol=1e-9)
    store.close()


def test_episodes_run_while_verdict_and_code_hold_and_close_on_change_or_gap(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'e.db'}")
    verdicts = ["IDLE"] * 5 + ["ACTIVE"] * 3 + [None] * 4 + ["ACTIVE"] * 2  # None: not evaluated (a gap)
    for m, v in enumerate(verdicts):
        if v is None:
            continue
        d = Decision("i-1", "r", Verdict(v), CODES[v], f"{v} at minute {m}", T0 + timedelta(minutes=m),
                     activity_mean=0.0 if v == "IDLE" else 70.0, hourly_cost=2.0)
        store.record_decisions(f"run{m}", [d], dry_run=False, max_gap_s=120)
    ep = store.episode_frame(with_reason=True)
    assert ep["verdict"].tolist() == ["IDLE", "ACTIVE", "ACTIVE"]  # the 4-minute gap closes the second one
    assert ep["ticks"].tolist() == [5, 3, 2]
    assert (ep["last_seen_at"] - ep["started_at"]).dt.total_seconds().tolist() == [240, 120, 60]
    assert ep["reason"].tolist() == ["IDLE at minute 4", "ACTIVE at minute 7", "ACTIVE at minute 13"]
    runs = store.service_run_frame()
    assert runs["ticks"].tolist() == [8, 2]
    store.close()


def test_raw_rows_are_kept_only_for_the_recent_window(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    for h in range(0, 30):
        d = Decision("i-1", "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle", T0 + timedelta(hours=h),
                     hourly_cost=1.0)
        store.record_decisions(f"run{h}", [d], dry_run=True, max_gap_s=7200, raw_keep_s=6 * 3600)
    raw = store.decision_rows()
    assert raw[0]["evaluated_at"] >= T0 + timedelta(hours=29 - 7)  # pruned hourly, window 6 h
    vc = verdict_costs(store.verdict_hours_frame(MONTH_START, MONTH_END), MONTH_START, MONTH_END, max_gap_s=7200)
    assert vc["hours"].sum() == pytest.approx(29 + 2)  # the pruned hours are still counted, the tail up to 2 h
    store.close()


def test_audit_history_lists_each_verdict_episode_with_how_long_it_held(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'h.db'}")
    for m in range(6):
        v = Verdict.IDLE if m < 4 else Verdict.ACTIVE
        d = Decision("i-1", "r", v, CODES[v.value], f"{v.value} {m}", T0 + timedelta(minutes=m), hourly_cost=1.0)
        store.record_decisions(f"run{m}", [d], dry_run=True, max_gap_s=120)
    rows = store.verdict_history(instance_id="i-1")
    assert [(r["verdict"], r["ticks"]) for r in rows] == [("IDLE", 4), ("ACTIVE", 2)]
    assert rows[0]["evaluated_at"] == T0 and rows[0]["reason"].startswith("IDLE 3 [4 evaluation(s) until ")
    assert store.verdict_history(start=T0 + timedelta(minutes=4)) == rows[1:]
    store.close()
