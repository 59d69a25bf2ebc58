"""The compact raw decision window (Store.record_decisions with raw_every_s, store.raw_decisions_every_s): a
raw row only when an (instance, rule)'s verdict or code changes (or after a gap), plus one an hour while it
holds. The same ticks recorded with every raw row and compactly give the same episodes, rollups, tails and
service runs, the same answers to every reader (budgets' "running now", the audit history, idle costs), far
fewer raw rows, and the retention prune still works."""

from __future__ import annotations

import os
import random
import time
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest
from sqlalchemy import select

from gpufinops.cost.budgets import running_now
from gpufinops.cost.costs import idle_cost_report, verdict_costs
from gpufinops.model import Decision, ReasonCode, Verdict
from gpufinops.store.schema import service_runs, verdict_episodes, verdict_hours, verdict_tails
from gpufinops.store.store import Store

T0 = datetime(2026, 10, 1, 0, 0, 30, tzinfo=timezone.utc)  # off the hour: heartbeats fall mid-episode
MONTH_START = datetime(2026, 10, 1, tzinfo=timezone.utc)
MONTH_END = datetime(2026, 11, 1, tzinfo=timezone.utc)
CODES = {"ACTIVE": ReasonCode.BUSY, "UNDERUTILIZED": ReasonCode.BURSTY_LOW, "IDLE": ReasonCode.IDLE_STAYS_BELOW,
         "UNKNOWN": ReasonCode.NO_SERIES}
INSTANCES = ("i-a", "i-b", "i-c", "i-d", "i-e")
FRESH_S = 900
GAP_S = 120


@pytest.fixture(params=["sqlite", "postgres"])
def urls(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'full.db'}", f"sqlite:///{tmp_path / 'compact.db'}"
    return new_postgres_db(request.getfixturevalue("postgres_url")), request.getfixturevalue("fresh_postgres_db")


def new_postgres_db(postgres_url: str) -> str:
    """A second empty database on the shared server (fresh_postgres_db gives one per test)."""
    import psycopg

    name = f"raw{os.getpid()}_{time.monotonic_ns()}"
    user, hostport = postgres_url.rsplit("/", 1)[0].replace("postgresql+psycopg://", "").split("@")
    host, port = hostport.split(":")
    with psycopg.connect(f"host={host} port={port} user={user} dbname=postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://{user}@{host}:{port}/{name}"


def steady_ticks(minutes: int, seed: int = 3):
    """Two rules judging five instances every minute in stretches of one verdict (as a fleet does), with a
    service outage, an instance stopped (not evaluated), one reported not running, price and team changes."""
    rnd = random.Random(seed)
    state = {i: ("IDLE", 0) for i in INSTANCES}
    out = []
    for m in range(minutes):
        at = T0 + timedelta(minutes=m)
        if 50 <= m < 58:  # the service was down for 8 minutes: a gap longer than max_gap_s
            continue
        ds, teams, types = [], {}, {}
        for n, inst in enumerate(INSTANCES):
            if inst == "i-c" and 100 <= m < 140:  # stopped for 40 minutes: no decisions at all
                continue
            verdict, left = state[inst]
            if left <= 0:
                verdict, left = rnd.choice(list(CODES)), int(rnd.expovariate(1 / 40)) + 1
            state[inst] = (verdict, left - 1)
            not_running = inst == "i-e" and 200 <= m < 260
            rate = None if inst == "i-d" else (3.0 if m < 170 else 4.5) * (n + 1)  # a price change mid-episode
            for rule, v in (("default", verdict), ("strict", "IDLE" if verdict == "UNDERUTILIZED" else verdict)):
                code = ReasonCode.NOT_RUNNING if not_running else CODES[v]
                v = "UNKNOWN" if not_running else v
                measured = v != "UNKNOWN"
                ds.append(Decision(inst, rule, Verdict(v), code, f"{v} at {m} ({rnd.random():.3f})", at,
                                   activity_mean=rnd.uniform(0, 90) if measured else None,
                                   activity_max=rnd.uniform(50, 100) if measured else None,
                                   memory_max_mib=rnd.uniform(0, 80000) if measured else None,
                                   coverage=1.0, hourly_cost=rate))
            teams[inst] = "" if inst == "i-b" else ("ml" if m < 120 else "vision")
            types[inst] = "p4d.24xlarge" if inst == "i-a" else "g5.xlarge"
        out.append((at, ds, teams, types))
    return out


def catalog(itype: str, region: str) -> float | None:
    return {"g5.xlarge": 1.006}.get(itype)


def table(store: Store, t) -> pd.DataFrame:
    cols = [c for c in t.columns if c.name != "id"]
    with store.engine.connect() as conn:
        frame = pd.DataFrame(conn.execute(select(*cols)).mappings().all(), columns=[c.name for c in cols])
    return frame.sort_values([c.name for c in cols]).reset_index(drop=True)


def expected_compact(full_rows: list[dict], every_s: float) -> list[tuple]:
    """The raw rows a compact window keeps, worked out from every raw row: the first of each (instance,
    rule) stretch of one (verdict, code) with ticks at most GAP_S apart, and its first in each clock hour."""
    last: dict[tuple, dict] = {}
    kept = []
    for r in full_rows:
        key = (r["instance_id"], r["rule"])
        prev = last.get(key)
        at = r["evaluated_at"]
        new_episode = (prev is None or (prev["verdict"], prev["code"]) != (r["verdict"], r["code"])
                       or (at - prev["evaluated_at"]).total_seconds() > GAP_S)
        new_bucket = prev is not None and (int(at.timestamp() // every_s)
                                           != int(prev["evaluated_at"].timestamp() // every_s))
        if new_episode or new_bucket:
            kept.append(r)
        last[key] = r
    return [(r["instance_id"], r["rule"], r["evaluated_at"], r["verdict"], r["code"], r["reason"]) for r in kept]


def running(frame_rows, now: datetime) -> pd.DataFrame:
    out = running_now(frame_rows, now, FRESH_S, {}, catalog, {}, "us-east-1")
    return out.sort_values("instance_id").reset_index(drop=True)


def test_compact_raw_window_keeps_every_readers_answer(urls):
    full, compact = Store(urls[0]), Store(urls[1])
    checked = 0
    for n, (at, ds, teams, types) in enumerate(steady_ticks(360)):
        for store, every in ((full, None), (compact, 3600)):
            store.record_decisions(f"run{n}", ds, dry_run=True, teams=teams, types=types, max_gap_s=GAP_S,
                                   raw_every_s=every)
        if n % 7 == 0 or 50 <= n <= 60 or 100 <= n <= 125:  # and each tick after the outage and in the stop
            # Budgets' "running now", as the live check asks it 20 s after a tick: before, from the recent raw
            # rows (Store.decision_frame); now, from the episodes (Store.latest_decisions).
            now = at + timedelta(seconds=20)
            lo = max(MONTH_START, now - timedelta(seconds=FRESH_S))
            before = running(full.decision_frame(lo, MONTH_END).to_dict("records"), now)
            after = running(compact.latest_decisions(lo, now), now)
            pd.testing.assert_frame_equal(before, after)
            checked += 1
    assert checked > 60
    # The running-now answers varied: the stop and the not-running span took instances out, prices changed.
    end = T0 + timedelta(minutes=359, seconds=20)
    assert len(running(compact.latest_decisions(end - timedelta(seconds=FRESH_S), end), end)) == 5

    # Everything derived from the ticks is the same ...
    for t in (verdict_episodes, verdict_hours, verdict_tails, service_runs):
        pd.testing.assert_frame_equal(table(full, t), table(compact, t), check_dtype=False)
    assert full.verdict_history() == compact.verdict_history()  # `audit --decisions`
    kw = dict(max_gap_s=GAP_S, catalog=catalog, default_region="us-east-1")
    idle = [idle_cost_report(verdict_costs(s.verdict_hours_frame(MONTH_START, end, grain="period"), MONTH_START,
                                           end, **kw), "instance") for s in (full, compact)]
    pd.testing.assert_frame_equal(*idle)

    # ... and the raw window holds the changes and the hourly heartbeats only.
    every = full.decision_rows()
    kept = compact.decision_rows()
    assert [(r["instance_id"], r["rule"], r["evaluated_at"], r["verdict"], r["code"], r["reason"]) for r in kept] \
        == expected_compact(every, 3600)
    assert {tuple(sorted(r)) for r in kept} == {tuple(sorted(r)) for r in every}  # whole rows, same columns
    assert len(kept) < len(every) / 10
    full.close()
    compact.close()


def test_compact_raw_window_is_pruned_after_raw_keep_s(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    for m in range(0, 30 * 60, 5):  # 30 h of one verdict, a tick every 5 minutes
        d = Decision("i-1", "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, f"idle {m}", T0 + timedelta(minutes=m),
                     hourly_cost=1.0)
        store.record_decisions(f"run{m}", [d], dry_run=True, max_gap_s=600, raw_keep_s=6 * 3600, raw_every_s=3600)
    raw = store.decision_rows()
    last = T0 + timedelta(minutes=30 * 60 - 5)
    assert raw[0]["evaluated_at"] >= last - timedelta(hours=7)  # pruned hourly, window 6 h
    assert 6 <= len(raw) <= 8  # one heartbeat an hour of the window (ticks: 72 in those hours)
    assert all(r["evaluated_at"].minute < 5 for r in raw)  # each the episode's first tick of its hour
    vc = verdict_costs(store.verdict_hours_frame(MONTH_START, MONTH_END), MONTH_START, MONTH_END, max_gap_s=600)
    assert vc["hours"].sum() == pytest.approx(30 - 5 / 60 + 10 / 60)  # every tick counted, the tail up to 10 min
    ep = store.episode_frame()
    assert ep["ticks"].tolist() == [360] and ep["last_seen_at"].tolist() == [pd.Timestamp(last)]
    store.close()


def test_every_tick_is_kept_raw_with_raw_every_s_zero_or_none(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'z.db'}")
    for m in range(10):
        d = Decision("i-1", "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle", T0 + timedelta(minutes=m))
        store.record_decisions(f"run{m}", [d], dry_run=True, raw_every_s=0 if m % 2 else None)
    assert len(store.decision_rows()) == 10
    store.close()


def test_many_ticks_in_one_call_fold_as_one_tick_a_call(urls):
    """A call with many ticks (the upgrade's backfill folds six hours at a time; bench builds an hour per call)
    writes what tick-by-tick calls write: a stored episode extended and then closed within the call keeps its
    extension (it was lost before: its ticks and last_seen_at stayed at the previous call's)."""
    one, batched = Store(urls[0]), Store(urls[1])
    ticks = steady_ticks(240)
    for n, (at, ds, teams, types) in enumerate(ticks):
        one.record_decisions(f"run{n}", ds, dry_run=True, teams=teams, types=types, max_gap_s=GAP_S,
                             raw_every_s=3600)
    for n in range(0, 240, 40):  # 40 minutes a call, cut at minute 120 where the teams change (one dict a call)
        chunk = [t for t in ticks if n <= (t[0] - T0).total_seconds() / 60 < n + 40]
        teams = {k: v for _, _, t, _ in chunk for k, v in t.items()}
        types = {k: v for _, _, _, t in chunk for k, v in t.items()}
        batched.record_decisions(f"batch{n}", [d for _, ds, _, _ in chunk for d in ds], dry_run=True,
                                 teams=teams, types=types, max_gap_s=GAP_S, raw_every_s=3600)
    for t in (verdict_episodes, verdict_hours, verdict_tails, service_runs):
        pd.testing.assert_frame_equal(table(one, t), table(batched, t), check_dtype=False)
    assert [r["reason"] for r in one.decision_rows()] == [r["reason"] for r in batched.decision_rows()]
    one.close()
    batched.close()
