"""Issue 23, item 10: an upgrade keeps history. A store at revision 0001 (raw decision rows only) holding three
months of a fleet's decisions is upgraded to head and then runs what the service runs after starting: a tick,
whose hourly prune deletes raw rows older than `store.raw_decisions_days`. Every month's report figures (idle $,
GPU-hours by verdict, stops) must come out identical to what the old rows themselves say, on SQLite and
PostgreSQL, and a second start must change nothing: nothing stored is lost."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest
from sqlalchemy import insert, text

from gpufinops.cost.costs import verdict_costs
from gpufinops.model import Decision, ReasonCode, Verdict
from gpufinops.report.audit import build_audit
from gpufinops.report.inputs import read_inputs
from gpufinops.report.period import report_period
from gpufinops.store.store import Store
from gpufinops.store.migrate import make_engine
from gpufinops.store.migrations import BASELINE, HEAD, SCRIPT_LOCATION
from tests.store.test_store_migrations import release_0_1_tables

TICK_S = 1800  # the old service's schedule: half-hour ticks keep 3 months of a fleet small (13,000 rows)
TICK, MAX_GAP_S = timedelta(seconds=TICK_S), 2 * TICK_S
FIRST, AFTER_LAST = datetime(2026, 6, 1), datetime(2026, 9, 1)  # naive UTC, as the old release stored it
MONTHS = ("2026-06", "2026-07", "2026-08")
FLEET = {"i-8gpu": ("p4d.24xlarge", 32.77, "ml"), "i-4gpu": ("g5.12xlarge", 5.67, "vision"),
         "i-1gpu": ("g5.xlarge", 1.01, "")}
GPUS = {"p4d.24xlarge": 8, "g5.12xlarge": 4, "g5.xlarge": 1}
# Each instance's day: busy, then low but bursty, then idle, then without metrics, in a rhythm of its own.
PHASES = (("ACTIVE", "busy", 55.0), ("UNDERUTILIZED", "underutilized", 20.0), ("IDLE", "idle_stays_below", 1.0),
          ("UNKNOWN", "no_series", None))


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'old.db'}"
    return request.getfixturevalue("fresh_postgres_db")


def old_decision_rows() -> list[dict]:
    """One row per instance every half hour for three months; a one-day outage of the service in July (no
    rows at all) and one instance stopped for a week in August (no rows for it)."""
    rows, at, tick = [], FIRST, 0
    while at < AFTER_LAST:
        if not (datetime(2026, 7, 10) <= at < datetime(2026, 7, 11)):
            for n, (iid, (itype, rate, team)) in enumerate(FLEET.items()):
                if iid == "i-4gpu" and datetime(2026, 8, 5) <= at < datetime(2026, 8, 12):
                    continue
                verdict, code, activity = PHASES[(tick // (3 + 2 * n)) % len(PHASES)]
                rows.append({"run_id": f"r{tick}", "instance_id": iid, "rule": "default", "verdict": verdict,
                             "code": code, "reason": f"{verdict} at {at:%H:%M}", "evaluated_at": at,
                             "window_s": 7200, "activity_mean": activity, "activity_max": activity,
                             "memory_max_mib": 1000.0, "coverage": None if activity is None else 1.0,
                             "hourly_cost": rate, "team": team, "instance_type": itype, "dry_run": False})
        at += TICK
        tick += 1
    return rows


def old_stops() -> list[dict]:
    """Real and dry-run stops, a failed one, and a warning, in every month."""
    out = []
    for month in (6, 7, 8):
        for day, kind, dry, status in ((3, "stop", False, "done"), (14, "stop", True, "done"),
                                       (20, "stop", False, "failed"), (21, "mark", False, "done"),
                                       (25, "stop", False, "done")):
            at = datetime(2026, month, day, 9, 7)
            out.append({"run_id": f"a{month}{day}", "instance_id": "i-8gpu", "kind": kind, "rule": "default",
                        "dry_run": dry, "status": status, "reason": f"{kind} on {at:%m-%d}", "error": None, "at": at,
                        "finished_at": at + timedelta(seconds=3)})
    return out


def build_store_at_0001(url: str) -> None:
    """The first Alembic revision's tables, filled with the old release's rows."""
    from alembic import command
    from alembic.config import Config

    engine = make_engine(url)
    with engine.begin() as conn:
        cfg = Config()
        cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, BASELINE)
        # Written through SQLAlchemy's column types, as the old release wrote them (its tables, tests/test_store_migrations.py).
        _, decisions, actions = release_0_1_tables()
        conn.execute(insert(decisions), old_decision_rows())
        conn.execute(insert(actions), old_stops())
    engine.dispose()


def month_bounds(month: str) -> tuple[datetime, datetime]:
    start = datetime.strptime(month, "%Y-%m").replace(tzinfo=timezone.utc)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


def figures_from_old_rows(url: str) -> dict[str, dict]:
    """Each month's figures computed straight from the 0001 store's rows, before any upgrade: time per verdict
    the per-minute way (each tick covers the time to the instance's next tick, at most two ticks)."""
    engine = make_engine(url)
    with engine.connect() as conn:
        raw = pd.read_sql_query(text("SELECT * FROM decisions"), conn)
        acts = pd.read_sql_query(text("SELECT kind, dry_run, status, at FROM actions"), conn)
    engine.dispose()
    raw["evaluated_at"] = pd.to_datetime(raw["evaluated_at"], utc=True)
    acts["at"] = pd.to_datetime(acts["at"], utc=True)
    out = {}
    for month in MONTHS:
        start, end = month_bounds(month)
        vc = verdict_costs(raw, start, end, max_gap_s=MAX_GAP_S)
        in_month = acts[(acts["at"] >= start) & (acts["at"] < end)]
        out[month] = summary(vc, stops=int(((in_month["kind"] == "stop") & ~in_month["dry_run"].astype(bool)
                                            & (in_month["status"] == "done")).sum()))
    return out


def summary(vc: pd.DataFrame, stops: int) -> dict:
    gpu_hours = (vc["hours"] * vc["instance_type"].map(GPUS)).groupby(vc["verdict"]).sum()
    return {"idle_cost": round(float(vc.loc[vc["verdict"] == "IDLE", "cost"].sum()), 6),
            "gpu_hours": {v: round(float(h), 6) for v, h in gpu_hours.items()}, "stops": stops}


def figures_from_store(store: Store) -> dict[str, dict]:
    """Each month's figures as the upgraded service counts them: from the rollups, as `costs --idle`, budgets
    and the report read them, and stops from the audit log."""
    out = {}
    for month in MONTHS:
        start, end = month_bounds(month)
        vc = verdict_costs(store.verdict_hours_frame(start, end), start, end, max_gap_s=MAX_GAP_S)
        real = [a for a in store.action_rows(start=start, end=end)
                if a.kind.value == "stop" and not a.dry_run and a.status == "done"]
        out[month] = summary(vc, stops=len(real))
    return out


REPORT_FIGURES = ("idle_cost", "idle_hours", "idle_gpu_hours", "underutilized_cost", "evaluated_cost", "gpu_hours",
                  "instance_hours", "missing_data_hours", "evaluations", "instances", "stops", "dry_run_stops",
                  "failed_stops", "saved_cost")


def report_figures(store: Store, now: datetime) -> dict[str, dict]:
    """Each month's headline of the monthly report itself (idle $, GPU-hours, stops, ...)."""
    def rounded(x):  # sums of the same hours in another order differ in the last bits only
        return round(x, 6) if isinstance(x, float) else x

    out = {}
    for month in MONTHS:  # the month's audit as `gpufinops report` builds it (the month alone: the trend's month before is the same code)
        headline = build_audit(read_inputs(store, report_period(month, now), None), fallback_period_s=TICK_S).headline
        out[month] = {k: rounded(headline[k]) for k in REPORT_FIGURES}
    return out


def raw_rows(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM decisions")).scalar())


def test_every_months_report_is_identical_after_the_upgrade_and_the_services_prune(db_url):
    build_store_at_0001(db_url)
    before = figures_from_old_rows(db_url)
    assert all(before[m]["idle_cost"] > 0 and len(before[m]["gpu_hours"]) == 4 and before[m]["stops"] == 2
               for m in MONTHS)

    store = Store(db_url)  # what the service does on start: the schema upgraded to head
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD
    now = datetime(2026, 9, 20, 12, 0, tzinfo=timezone.utc)
    report_before_prune = report_figures(store, now)
    assert raw_rows(store) == len(old_decision_rows())  # the upgrade keeps every raw row
    # ... then its first tick, weeks later: the hourly prune drops raw rows older than raw_decisions_days.
    store.record_decisions("first-tick", [Decision(iid, "default", Verdict.ACTIVE, ReasonCode.BUSY, "busy", now,
                                                   hourly_cost=rate) for iid, (_, rate, _) in FLEET.items()],
                           dry_run=False, teams={i: f[2] for i, f in FLEET.items()},
                           types={i: f[0] for i, f in FLEET.items()}, max_gap_s=MAX_GAP_S, raw_keep_s=7 * 86400)
    # The prune ran: as in the issue, no old raw row is left (only the new tick's), their time is in the rollups.
    assert raw_rows(store) == len(FLEET)
    assert figures_from_store(store) == before
    assert report_figures(store, now) == report_before_prune
    assert all(report_before_prune[m]["evaluations"] > 0 and report_before_prune[m]["stops"] == 2 for m in MONTHS)
    store.close()

    again = Store(db_url)  # a restart changes nothing
    assert figures_from_store(again) == before
    assert report_figures(again, now) == report_before_prune
    again.close()
