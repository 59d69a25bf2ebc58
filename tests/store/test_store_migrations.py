"""The store's Alembic migrations: a database written before them (release 0.1.0's tables, decision rows in
it) is upgraded in place on start, on SQLite and PostgreSQL, its rows kept and folded into verdict episodes
and hourly rollups that count the same time and money as the rows themselves."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import (Boolean, Column, DateTime, Float, Integer, MetaData, String, Table, Text, insert, inspect,
                        text)

from gpufinops.cost.costs import idle_cost_report, verdict_costs
from gpufinops.model import Decision, ReasonCode, Verdict
from gpufinops.store.store import Store
from gpufinops.store.migrate import make_engine
from gpufinops.store.schema import metadata
from gpufinops.store.migrations import HEAD, SCRIPT_LOCATION

T0 = datetime(2026, 10, 3, 8, 0, 20)  # naive UTC, as the old release stored it
START, END = datetime(2026, 10, 1, tzinfo=timezone.utc), datetime(2026, 11, 1, tzinfo=timezone.utc)


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'old.db'}"
    return request.getfixturevalue("fresh_postgres_db")


def release_0_1_tables() -> tuple[MetaData, Table, Table]:
    """`decisions`, `actions` and `kv` as release 0.1.0 created them (create_all, no Alembic)."""
    old = MetaData()
    decisions = Table(
        "decisions", old,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("run_id", String(32), nullable=False, index=True),
        Column("instance_id", String(64), nullable=False, index=True),
        Column("rule", String(128), nullable=False), Column("verdict", String(16), nullable=False),
        Column("code", String(32), nullable=False), Column("reason", Text, nullable=False),
        Column("evaluated_at", DateTime, nullable=False, index=True), Column("window_s", Integer),
        Column("activity_mean", Float), Column("activity_max", Float), Column("memory_max_mib", Float),
        Column("coverage", Float), Column("hourly_cost", Float), Column("team", String(128)),
        Column("instance_type", String(64)), Column("dry_run", Boolean, nullable=False))
    actions = Table(
        "actions", old,
        Column("id", Integer, primary_key=True, autoincrement=True), Column("run_id", String(32), nullable=False),
        Column("instance_id", String(64), nullable=False, index=True), Column("kind", String(16), nullable=False),
        Column("rule", String(128)), Column("dry_run", Boolean, nullable=False),
        Column("status", String(16), nullable=False), Column("reason", Text, nullable=False),
        Column("error", Text), Column("at", DateTime, nullable=False, index=True), Column("finished_at", DateTime))
    Table("kv", old, Column("key", String(128), primary_key=True), Column("value", Text, nullable=False))
    return old, decisions, actions


def old_rows() -> list[dict]:
    """Three instances, two rules, a tick a minute for three hours, a 10-minute outage, rules disagreeing."""
    rows = []
    for m in range(180):
        if 60 <= m < 70:
            continue
        at = T0 + timedelta(minutes=m)
        for n, inst in enumerate(("i-1", "i-2", "i-3")):
            idle = (m // (20 + 7 * n)) % 2 == 0
            for rule in ("default", "zero-activity"):
                verdict = "IDLE" if idle and (rule == "default" or m % 3) else "ACTIVE"
                rows.append({"run_id": f"r{m}", "instance_id": inst, "rule": rule, "verdict": verdict,
                             "code": "idle_stays_below" if verdict == "IDLE" else "busy", "reason": f"{verdict} {m}",
                             "evaluated_at": at, "window_s": 7200, "activity_mean": 1.0 if idle else 55.0,
                             "activity_max": 2.0 if idle else 90.0, "memory_max_mib": 1000.0, "coverage": 1.0,
                             "hourly_cost": 2.5 * (n + 1), "team": "ml" if n else "", "instance_type": "g5.xlarge",
                             "dry_run": True})
    return rows


def costs_by_instance(vc):
    return idle_cost_report(vc, "instance").set_index("instance").sort_index()


def test_the_head_constant_is_the_newest_revision():
    from alembic.script import ScriptDirectory

    assert ScriptDirectory(str(SCRIPT_LOCATION)).get_current_head() == HEAD


def test_a_database_from_before_alembic_is_upgraded_in_place(db_url):
    old, decisions, actions = release_0_1_tables()
    engine = make_engine(db_url)
    old.create_all(engine)
    rows = old_rows()
    with engine.begin() as conn:
        conn.execute(insert(decisions), rows)
        conn.execute(insert(actions).values(run_id="r1", instance_id="i-1", kind="notify", rule="default",
                                            dry_run=True, status="done", reason="warned", at=T0))
    engine.dispose()

    store = Store(db_url)  # upgrades on start
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD
        assert conn.execute(text("SELECT count(*) FROM decisions")).scalar() == len(rows)  # nothing lost
        assert conn.execute(text("SELECT count(*) FROM kv")).scalar() == 0  # the backfill is done
    assert len(store.action_rows()) == 1
    per_minute = verdict_costs(store.decision_frame(START, END), START, END, max_gap_s=120)
    rolled = verdict_costs(store.verdict_hours_frame(START, END), START, END, max_gap_s=120)
    a, b = costs_by_instance(per_minute), costs_by_instance(rolled)
    assert ((a[["idle_cost", "active_cost", "total_cost"]] - b[["idle_cost", "active_cost", "total_cost"]])
            .abs().max().max()) < 0.005
    assert a["idle_cost"].sum() > 0
    episodes = store.episode_frame()
    assert episodes["ticks"].sum() == len(rows)
    assert store.service_run_frame()["ticks"].tolist() == [60, 110]  # the outage splits the service's run
    store.close()

    # A second start changes nothing; the service then records on top of the backfilled tail.
    again = Store(db_url)
    assert len(again.episode_frame()) == len(episodes)
    nxt = T0.replace(tzinfo=timezone.utc) + timedelta(minutes=180)
    again.record_decisions("r180", [Decision("i-1", "default", Verdict.ACTIVE, ReasonCode.BUSY, "busy", nxt,
                                             hourly_cost=2.5)], dry_run=True, max_gap_s=120)
    after = verdict_costs(again.verdict_hours_frame(START, END), START, END, max_gap_s=120)
    assert after["hours"].sum() == pytest.approx(rolled["hours"].sum() + 1 / 60 + 0)  # the old tail got its minute
    again.close()


CORE_TABLES = ("decisions", "instance_state", "marks", "actions", "notifications", "kv", "leases",
               "verdict_episodes", "verdict_hours", "verdict_tails", "service_runs", "instance_labels",
               "k8s_node_hours")


def schema_of(url: str) -> dict:
    engine = make_engine(url)
    insp = inspect(engine)
    out = {t: ({(c["name"], c["nullable"]) for c in insp.get_columns(t)},
               {tuple(i["column_names"]) for i in insp.get_indexes(t)}) for t in CORE_TABLES}
    engine.dispose()
    return out


def test_the_migrations_build_the_schema_the_code_declares(tmp_path):
    migrated = f"sqlite:///{tmp_path / 'migrated.db'}"
    Store(migrated).close()  # a fresh database: baseline + every revision, then create_all
    declared = f"sqlite:///{tmp_path / 'declared.db'}"
    engine = make_engine(declared)
    metadata.create_all(engine)
    engine.dispose()
    assert schema_of(migrated) == schema_of(declared)


def test_a_database_at_0002_is_upgraded_to_instance_labels_keeping_its_rows(db_url):
    """0002 -> 0003 adds instance_labels and touches nothing stored: decisions, episodes, rollups, tails, runs,
    actions and kv come back as they were, and the new table fills from the next tick."""
    from alembic import command
    from alembic.config import Config

    engine = make_engine(db_url)
    with engine.begin() as conn:
        cfg = Config()
        cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")  # the schema of the release before instance_labels
        assert "instance_labels" not in inspect(conn).get_table_names()
    engine.dispose()
    old = Store.__new__(Store)  # the 0002 tables, written through the code that writes them, without migrating
    old.url, old.engine = db_url, make_engine(db_url)
    t = T0.replace(tzinfo=timezone.utc)
    for m in range(3):
        old.record_decisions(f"r{m}", [Decision("i-1", "default", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle",
                                                t + timedelta(minutes=m), hourly_cost=2.5)],
                             dry_run=True, teams={"i-1": "ml"}, max_gap_s=120)
    old.set_kv("k", "v")
    tables = ("decisions", "verdict_episodes", "verdict_hours", "verdict_tails", "service_runs", "kv")

    def contents(engine):
        with engine.connect() as conn:
            return {n: sorted(tuple(map(str, r)) for r in conn.execute(text(f"SELECT * FROM {n}"))) for n in tables}

    before = contents(old.engine)
    old.close()
    assert len(before["decisions"]) == 3 and before["verdict_episodes"]

    store = Store(db_url)  # upgrades on start
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD
    assert contents(store.engine) == before  # nothing stored is lost or changed
    assert store.instance_labels() == {}
    from gpufinops.model import GpuInstance

    store.record_instances([GpuInstance("i-1", "g5.xlarge", "us-east-1", "running", t, tags={"owner": "ana"})],
                           t + timedelta(minutes=3))
    assert store.instance_labels()["i-1"]["owner"] == "ana"
    store.close()


def test_the_oldest_tick_is_folded_when_sqlite_holds_it_without_fractional_seconds(tmp_path):
    """Rows written by another client as "YYYY-MM-DD HH:MM:SS" text: the backfill's first window still holds
    the oldest tick (compared as text, it sorts before the bound SQLAlchemy writes, with ".000000")."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old, decisions, _ = release_0_1_tables()
    engine = make_engine(url)
    old.create_all(engine)
    rows = old_rows()
    with engine.begin() as conn:
        conn.exec_driver_sql(  # through the driver, so the timestamp is stored as str(datetime)
            "INSERT INTO decisions (run_id, instance_id, rule, verdict, code, reason, evaluated_at, window_s, "
            "hourly_cost, team, instance_type, dry_run) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(r["run_id"], r["instance_id"], r["rule"], r["verdict"], r["code"], r["reason"],
              str(r["evaluated_at"]), r["window_s"], r["hourly_cost"], r["team"], r["instance_type"], 0)
             for r in rows])
    engine.dispose()
    store = Store(url)
    assert store.episode_frame()["ticks"].sum() == len(rows)  # every tick, the oldest one too
    store.close()


def test_a_database_at_0003_is_upgraded_to_node_hours_keeping_its_rows(db_url):
    """0003 -> 0004 adds k8s_node_hours and touches nothing stored; the table then fills from the next tick that
    reads the cluster."""
    from alembic import command
    from alembic.config import Config

    from gpufinops.places.kubernetes.cluster import snapshot_from
    from gpufinops.run.node_hours import node_hour_rows
    from tests.kubestub import node_obj

    engine = make_engine(db_url)
    with engine.begin() as conn:
        cfg = Config()
        cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0003")  # the schema of the release before the node rollup
        assert "k8s_node_hours" not in inspect(conn).get_table_names()
    engine.dispose()
    old = Store.__new__(Store)  # the 0003 tables, written through the code that writes them, without migrating
    old.url, old.engine = db_url, make_engine(db_url)
    t = T0.replace(tzinfo=timezone.utc)
    for m in range(3):
        old.record_decisions(f"r{m}", [Decision("i-1", "default", Verdict.IDLE, ReasonCode.IDLE_STAYS_BELOW, "idle",
                                                t + timedelta(minutes=m), hourly_cost=2.5)],
                             dry_run=True, teams={"i-1": "ml"}, max_gap_s=120)
    with old.engine.begin() as conn:  # an instance_labels row as 0003 wrote it (the later columns are added on start)
        conn.execute(text("INSERT INTO instance_labels (instance_id, owner, first_seen, last_seen) "
                          "VALUES ('i-1', 'ana', :t, :t)"), {"t": T0})
    tables = ("decisions", "verdict_episodes", "verdict_hours", "verdict_tails", "service_runs", "kv")

    def contents(engine):
        with engine.connect() as conn:
            return {n: sorted(tuple(map(str, r)) for r in conn.execute(text(f"SELECT * FROM {n}"))) for n in tables}

    before = contents(old.engine)
    old.close()

    store = Store(db_url)  # upgrades on start
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD
    assert contents(store.engine) == before  # nothing stored is lost or changed
    assert store.instance_labels()["i-1"]["owner"] == "ana"
    assert store.node_hours_frame(START, END).empty
    snap = snapshot_from(t, [node_obj("n0", "i-0aaa0000000000001")], [], {}, [])
    store.record_node_hours(t + timedelta(minutes=3), lambda s0, s: node_hour_rows(snap, {"n0": 12.0}, s0, s),
                            interval_s=60, max_gap_s=120)
    [row] = store.node_hours_frame(START, END).to_dict("records")
    assert row["node_cents"] == row["idle_cents"] == 20 and row["empty_ticks"] == 1  # a minute of $12/h, no pod
    store.close()


def test_a_database_at_0004_is_upgraded_to_gpu_allocation_old_rows_reading_device_plugin(db_url):
    """0004 -> 0005 adds k8s_node_hours.allocation and .dra_cents and instance_labels.allocation in place: the node
    hours stored before read "device-plugin" and 0 DRA cents (every GPU counted then was a device plugin's), nothing
    else stored changes; the next tick writes how its nodes' GPUs were allocated, and a workload seen with no GPU
    (scaled to zero) keeps the allocation stored for it."""
    from alembic import command
    from alembic.config import Config

    from gpufinops.model import GpuInstance

    engine = make_engine(db_url)
    with engine.begin() as conn:
        cfg = Config()
        cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0004")  # the schema of the release before the allocation columns
        assert "allocation" not in {c["name"] for c in inspect(conn).get_columns("k8s_node_hours")}
        hour = T0.replace(minute=0, second=0)
        conn.execute(text(  # a node hour as 0004's code wrote it
            "INSERT INTO k8s_node_hours (hour, node, instance_id, node_pool, sharing, gpus, hours, gpu_hours, "
            "node_cents, pods_cents, idle_cents, unpriced_hours, ticks, empty_ticks, empty_hours, last_seen) VALUES "
            "(:h, 'n0', 'i-0aaa0000000000001', 'train', 'whole', 8, 0.5, 4.0, 1639, 410, 1229, 0, 30, 0, 0, :t)"),
            {"h": hour, "t": T0})
        conn.execute(text("INSERT INTO instance_labels (instance_id, owner, first_seen, last_seen) "
                          "VALUES ('k8s:ml/Deployment/infer', 'ana', :t, :t)"), {"t": T0})
    engine.dispose()

    store = Store(db_url)  # upgrades on start
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD
    [row] = store.node_hours_frame(START, END).to_dict("records")
    assert (row["allocation"], row["dra_cents"]) == ("device-plugin", 0)
    assert ({k: row[k] for k in ("node", "node_pool", "sharing", "gpus", "node_cents", "pods_cents", "idle_cents",
                                  "ticks")}
            == {"node": "n0", "node_pool": "train", "sharing": "whole", "gpus": 8, "node_cents": 1639,
                "pods_cents": 410, "idle_cents": 1229, "ticks": 30})  # the stored row, unchanged
    assert store.instance_labels()["k8s:ml/Deployment/infer"]["allocation"] is None  # the report reads device-plugin

    t = T0.replace(tzinfo=timezone.utc) + timedelta(minutes=5)
    wl = GpuInstance("k8s:ml/Deployment/infer", "p4d.24xlarge", "us-east-1", "running", t, provider="kubernetes",
                     gpu_allocation="dra")
    store.record_instances([wl], t)
    assert store.instance_labels()["k8s:ml/Deployment/infer"]["allocation"] == "dra"
    store.record_instances([GpuInstance(wl.instance_id, "", "", "stopped", t, provider="kubernetes")],
                           t + timedelta(minutes=1))  # scaled to zero: no pod, no GPU seen
    assert store.instance_labels()["k8s:ml/Deployment/infer"]["allocation"] == "dra"
    store.close()


def test_a_database_at_0005_is_upgraded_to_cloud_ids_keeping_its_rows(db_url):
    """0005 -> 0006 adds instance_labels.cloud_id in place: a stored row keeps its labels (cloud_id NULL), and the
    next tick records a GCE VM's numeric id, which Store.cloud_ids maps back to the VM."""
    from alembic import command
    from alembic.config import Config

    from gpufinops.model import GpuInstance

    engine = make_engine(db_url)
    with engine.begin() as conn:
        cfg = Config()
        cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0005")
        assert "cloud_id" not in {c["name"] for c in inspect(conn).get_columns("instance_labels")}
        conn.execute(text("INSERT INTO instance_labels (instance_id, owner, first_seen, last_seen) "
                          "VALUES ('gce:ml/us-central1-a/l4-1', 'ana', :t, :t)"), {"t": T0})
    engine.dispose()

    store = Store(db_url)  # upgrades on start
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD == "0006"
    label = store.instance_labels()["gce:ml/us-central1-a/l4-1"]
    assert label["owner"] == "ana" and label["cloud_id"] is None and store.cloud_ids() == {}
    seen = datetime(2026, 10, 3, 9, 0, tzinfo=timezone.utc)
    store.record_instances([GpuInstance("gce:ml/us-central1-a/l4-1", "g2-standard-8", "us-central1", "running", seen,
                                        provider="gcp", tags={"owner": "ana"}, cloud_id="7000000000000001001")], seen)
    assert store.cloud_ids() == {"7000000000000001001": "gce:ml/us-central1-a/l4-1"}
    assert store.instance_labels()["gce:ml/us-central1-a/l4-1"]["owner"] == "ana"
    store.close()
