"""The database: SQLite file in WAL mode, survives restarts, one sender per notification key."""

import sqlite3
from datetime import datetime, timezone

import pytest

from gpufinops.model import Action, ActionKind, Decision, ReasonCode, Verdict
from gpufinops.store.schema import MarkRow
from gpufinops.store.store import Store

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """The same store tests on the default SQLite file and on a real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'g.db'}"
    return request.getfixturevalue("fresh_postgres_db")


def test_sqlite_file_is_in_wal_mode(tmp_path):
    db = tmp_path / "g.db"
    Store(f"sqlite:///{db}").set_kv("x", "1")
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_decisions_survive_a_restart_with_their_reasons(db_url):
    url = db_url
    d = Decision("i-1", "r", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "all idle", NOW, Action.STOP, 600,
                 hourly_cost=1.5)
    Store(url).record_decisions("run1", [d], dry_run=True, teams={"i-1": "ml"})
    rows = Store(url).decision_rows()
    assert len(rows) == 1
    row = rows[0]
    assert (row["verdict"], row["reason"], row["team"], row["dry_run"]) == ("IDLE", "all idle", "ml", True)
    assert row["evaluated_at"] == NOW  # timezone-aware UTC back out


def test_notification_delivery_is_shared_between_processes(db_url):
    a, b = Store(db_url), Store(db_url)  # two processes on one database
    a.record_notification("k", "#c", "t", "pending", NOW)
    assert not b.notification_sent("k") and b.delivered_at("k") is None  # fate unknown: looked up, not assumed
    a.record_notification("k", "#c", "t", "failed", NOW, detail="HTTP 500", attempts=1,
                          next_attempt_at=NOW.replace(minute=5), blocks=[{"type": "divider"}])
    assert b.notifications_due(NOW) == [] and b.undelivered_count() == 1
    [due] = b.notifications_due(NOW.replace(minute=5))
    assert due.blocks == ({"type": "divider"},) and due.attempts == 1
    b.record_notification("k", "#c", "t", "sent", NOW.replace(minute=6))
    assert a.notification_sent("k") and a.delivered_at("k") == NOW.replace(minute=6)
    a.abandon_notification("k", NOW, "cancelled")  # a delivered message stays delivered
    assert b.get_notification("k").status == "sent"


def test_marks_actions_state_and_kv_round_trip(db_url):
    s = Store(db_url)
    s.put_mark(MarkRow("i-1", "r", NOW, NOW, "idle", False))
    s.put_mark(MarkRow("i-1", "r", NOW, NOW.replace(hour=13), "idle again", True))  # replaces, not duplicates
    assert [(m.stop_at.hour, m.dry_run) for m in Store(db_url).all_marks()] == [(13, True)]
    aid = s.begin_action("run", "i-1", ActionKind.STOP, "r", False, "idle", NOW)
    assert [a.status for a in Store(db_url).action_rows(status="pending")] == ["pending"]
    s.finish_action(aid, True, NOW)
    assert Store(db_url).action_rows(status="pending") == []
    s.put_state("i-1", "r", Verdict.IDLE, NOW, NOW, None)
    s.put_state("i-1", "r", Verdict.IDLE, NOW, NOW, NOW)
    assert Store(db_url).get_state("i-1", "r").stopped_at == NOW
    s.set_kv("budget-escalation:2026-11:a", "1")
    s.set_kv("budget-escalation:2026-11:b", "2")
    s.set_kv("budget-escalation:2026-1_:x", "3")  # '_' in a prefix is a literal, not a wildcard
    assert [k for k, _ in Store(db_url).kv_items("budget-escalation:2026-11:")] == [
        "budget-escalation:2026-11:a", "budget-escalation:2026-11:b"]


def test_capability_tables_work_on_both_databases(db_url):
    """Billing costs and recommendations live in the same database, SQLite or Postgres."""
    from datetime import date

    import pandas as pd

    from gpufinops.collect.billing.schema import conform, load_costs, save_costs
    from gpufinops.recommend import engine  # noqa: F401 - registers the recommendations table

    s = Store(db_url)
    df = conform(pd.DataFrame([{
        "date": pd.Timestamp("2026-11-02"), "provider": "aws", "account": "1", "region": "us-east-1",
        "resource_id": "i-1", "instance_type": "p4d.24xlarge", "pricing_model": "on-demand", "team": "ml",
        "project": "", "owner": "", "tags": "{}", "cost": 527.0, "currency": "USD", "usage_hours": 24.0,
        "source": "cur"}]))
    assert save_costs(s, df, "cur", date(2026, 11, 1), date(2026, 12, 1), NOW) == 1
    assert save_costs(s, df, "cur", date(2026, 11, 1), date(2026, 12, 1), NOW) == 1  # replaced, not doubled
    back = load_costs(Store(db_url), date(2026, 11, 1), date(2026, 12, 1))
    assert len(back) == 1 and float(back["cost"].iloc[0]) == 527.0 and back["team"].iloc[0] == "ml"


def test_a_database_from_an_older_release_is_upgraded_without_losing_rows(db_url):
    from sqlalchemy import Column, DateTime, MetaData, String, Table, insert

    from gpufinops.store.migrate import make_engine

    # instance_state as the release before `stop_dry_run` wrote it, with one row in it.
    old_schema = MetaData()
    old = Table("instance_state", old_schema, Column("instance_id", String(64), primary_key=True),
                Column("rule", String(128), primary_key=True), Column("verdict", String(16), nullable=False),
                Column("since", DateTime, nullable=False), Column("updated_at", DateTime, nullable=False),
                Column("stopped_at", DateTime))
    engine = make_engine(db_url)
    old_schema.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(old).values(instance_id="i-1", rule="r", verdict="IDLE",
                                        since=datetime(2026, 11, 29, 10), updated_at=datetime(2026, 11, 29, 11),
                                        stopped_at=datetime(2026, 11, 29, 10, 30)))
    engine.dispose()
    store = Store(db_url)
    row = store.get_state("i-1", "r")
    assert (row.verdict, row.since.hour, row.stopped_at.minute, row.stop_dry_run) == (Verdict.IDLE, 10, 30, None)
    store.put_state("i-1", "r", Verdict.IDLE, row.since, NOW, NOW, True)
    assert Store(db_url).get_state("i-1", "r").stop_dry_run is True


def test_states_of_a_tick_are_read_once_and_written_in_one_batch(db_url):
    """Store.update_states (the act stage's per-tick state tracking): the stored rows are read in one
    statement, each key stepped in order (a repeated key sees its own first result), every result upserted in
    the same transaction: new keys inserted, stored ones updated, other rows untouched."""
    from dataclasses import replace

    from sqlalchemy import event

    from gpufinops.store.schema import StateRow

    s = Store(db_url)
    s.put_state("i-1", "r", Verdict.IDLE, NOW.replace(hour=10), NOW.replace(hour=11), NOW.replace(hour=10), True)
    s.put_state("i-2", "r", Verdict.ACTIVE, NOW.replace(hour=9), NOW.replace(hour=11), None)
    s.put_state("i-9", "r", Verdict.IDLE, NOW.replace(hour=8), NOW.replace(hour=11), None)
    seen = []

    def step(key, prev):
        seen.append((key, prev and (prev.verdict, prev.updated_at)))
        if prev is None:
            return StateRow(key[0], key[1], Verdict.UNKNOWN, NOW, NOW, None)
        return replace(prev, updated_at=NOW, verdict=Verdict.IDLE)

    statements = []
    event.listen(s.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    keys = [("i-1", "r"), ("i-2", "r"), ("i-3", "r"), ("i-1", "other"), ("i-3", "r")]
    out = s.update_states(keys, step)
    assert [k for k, _ in seen] == keys
    assert seen[0][1] == (Verdict.IDLE, NOW.replace(hour=11)) and seen[2][1] is None
    assert seen[4][1] == (Verdict.UNKNOWN, NOW)  # the repeated key saw its own first step
    assert sum(st.lstrip().upper().startswith(("SELECT", "INSERT", "UPDATE")) for st in statements) == 2
    fresh = Store(db_url)
    assert fresh.get_state("i-1", "r") == out[("i-1", "r")]
    assert (fresh.get_state("i-1", "r").stopped_at, fresh.get_state("i-1", "r").stop_dry_run) == (NOW.replace(hour=10), True)
    assert fresh.get_state("i-2", "r").verdict == Verdict.IDLE and fresh.get_state("i-2", "r").since.hour == 9
    assert fresh.get_state("i-3", "r").verdict == Verdict.IDLE  # inserted, then stepped again
    assert fresh.get_state("i-1", "other").verdict == Verdict.UNKNOWN
    assert fresh.get_state("i-9", "r").updated_at == NOW.replace(hour=11)  # not in the tick: untouched
    assert s.update_states([], step) == {}


def test_instance_labels_upsert_keeps_first_seen_and_follows_tags(db_url):
    """Store.record_instances (once per tick): new instances inserted, known ones get the tick's tags and
    last_seen, first_seen stays; tag values are stored as text, clipped to the column."""
    from datetime import timedelta

    from gpufinops.model import GpuInstance

    def inst(iid, **tags):
        return GpuInstance(iid, "g5.xlarge", "eu-west-1", "running", NOW - timedelta(days=1), account="111122223333",
                           tags=tags, gpu_count=1, gpu_model="A10G")

    s = Store(db_url)
    assert s.record_instances([], NOW) == 0
    assert s.record_instances([inst("i-1", owner="ana", team="ml"), inst("i-2", Owner="li")], NOW) == 2
    later = NOW + timedelta(minutes=5)
    hostile = "<script>alert(1)</script>" + "x" * 300
    # The same instance twice in one listing (two regions answering alike) is one row, not a conflict.
    assert s.record_instances([inst("i-1", owner=hostile, team="vision"), inst("i-1", owner=hostile, team="vision")],
                              later) == 1
    labels = Store(db_url).instance_labels()
    assert set(labels) == {"i-1", "i-2"}
    one, two = labels["i-1"], labels["i-2"]
    assert (one["first_seen"], one["last_seen"]) == (NOW, later)
    assert one["owner"] == hostile[:128] and one["team"] == "vision"
    assert (one["account"], one["region"], one["instance_type"], one["gpu_model"], one["gpu_count"],
            one["provider"]) == ("111122223333", "eu-west-1", "g5.xlarge", "A10G", 1, "aws")
    assert (two["owner"], two["team"], two["first_seen"], two["last_seen"]) == ("li", "", NOW, NOW)
    assert set(s.instance_labels(["i-2", "i-9"])) == {"i-2"}
