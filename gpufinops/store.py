"""The database: verdicts (episodes, hourly rollups, recent raw decisions), marks, actions, notifications, state.

Each tick's decisions are recorded once (`Store.record_decisions`): the raw rows, kept for
StoreSettings.raw_decisions_days, and in the same transaction the verdict episodes and hourly rollups that
reports, idle costs and budgets read (gpufinops/episodes.py). The actions audit trail is complete and
append-only. Each tick also upserts what the inventory listed of each instance (`Store.record_instances`:
owner, team, account, region, type; the report's owner / account / region columns). The schema is migrated on
start (Alembic, gpufinops/store_migrations).

SQLite (file, WAL) by default; any SQLAlchemy URL (postgresql://...) works.
Capabilities (billing, recommend, ...) define their own tables on the shared
`metadata` and get them created by the same Store.
"""

from __future__ import annotations

import logging
import time
import json
from operator import itemgetter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterable, Sequence

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    create_engine,
    event,
    insert,
    inspect,
    text,
    select,
    update,
    delete,
    func,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, OperationalError

from .episodes import Episode, HourAgg, Heads, Run, Tail, fold_ticks
from .model import ActionKind, ActionResult, Decision, GpuInstance, Verdict

log = logging.getLogger(__name__)
metadata = MetaData()


# SQLite drops tzinfo: we store naive UTC and hand back aware datetimes.
def aware_utc(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def naive_utc(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
    return dt


decisions = Table(
    "decisions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(32), nullable=False, index=True),
    Column("instance_id", String(64), nullable=False, index=True),
    Column("rule", String(128), nullable=False),
    Column("verdict", String(16), nullable=False),
    Column("code", String(32), nullable=False),
    Column("reason", Text, nullable=False),
    Column("evaluated_at", DateTime, nullable=False, index=True),
    Column("window_s", Integer),
    Column("activity_mean", Float),
    Column("activity_max", Float),
    Column("memory_max_mib", Float),
    Column("coverage", Float),
    Column("hourly_cost", Float),
    Column("team", String(128)),
    Column("instance_type", String(64)),
    Column("dry_run", Boolean, nullable=False),
)

# Verdicts as run-length episodes and hourly rollups (gpufinops/episodes.py folds each tick into them). The
# raw `decisions` rows are kept only for a recent window (StoreSettings.raw_decisions_days); reports, idle
# costs and budgets read these.
verdict_episodes = Table(
    "verdict_episodes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("instance_id", String(64), nullable=False),
    Column("rule", String(128), nullable=False),
    Column("verdict", String(16), nullable=False),
    Column("code", String(32), nullable=False),
    Column("started_at", DateTime, nullable=False),
    Column("last_seen_at", DateTime, nullable=False, index=True),
    Column("ticks", Integer, nullable=False),
    Column("reason", Text, nullable=False),  # the latest tick's reason text
    Column("stats", Text),  # JSON: the latest tick's window stats (window_s, activity, memory, coverage)
    Column("hourly_cost", Float),
    Column("team", String(128)),
    Column("instance_type", String(64)),
    Column("dry_run", Boolean, nullable=False),
    Index("ix_verdict_episodes_head", "instance_id", "rule", "id"),
)

# Per hour and instance, rules resolved per tick (least idle wins): hours in each verdict, by reason code,
# price, team and type. `measured` = the ticks had an activity figure (activity_hours / hours is their mean).
verdict_hours = Table(
    "verdict_hours",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("hour", DateTime, nullable=False),
    Column("instance_id", String(64), nullable=False),
    Column("verdict", String(16), nullable=False),
    Column("code", String(32), nullable=False),
    Column("measured", Boolean, nullable=False),
    Column("hourly_cost", Float),
    Column("team", String(128)),
    Column("instance_type", String(64)),
    Column("hours", Float, nullable=False),
    Column("ticks", Integer, nullable=False),
    Column("evaluations", Integer, nullable=False),
    Column("activity_hours", Float, nullable=False),
    Column("activity_max", Float),
    Column("memory_max_mib", Float),
    Column("after_stop_hours", Float, nullable=False),  # of `hours`, after a completed stop (report: not running)
    Index("ix_verdict_hours_hour_instance", "hour", "instance_id"),
)

# The latest resolved tick of each instance: its time is counted by readers up to their end (max_gap_s).
verdict_tails = Table(
    "verdict_tails",
    metadata,
    Column("instance_id", String(64), primary_key=True),
    Column("at", DateTime, nullable=False),
    Column("verdict", String(16), nullable=False),
    Column("code", String(32), nullable=False),
    Column("hourly_cost", Float),
    Column("team", String(128)),
    Column("instance_type", String(64)),
    Column("activity_mean", Float),
    Column("activity_max", Float),
    Column("memory_max_mib", Float),
    Column("evaluations", Integer, nullable=False),
)

# Stretches in which the service evaluated anything at most max_gap_s apart (coverage, blind spots).
service_runs = Table(
    "service_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("started_at", DateTime, nullable=False),
    Column("last_seen_at", DateTime, nullable=False, index=True),
    Column("ticks", Integer, nullable=False),
)

ROLLUP_TABLES = ("verdict_episodes", "verdict_hours", "verdict_tails", "service_runs")

# What the service saw of each instance in its inventory, latest tick wins (Store.record_instances): the owner,
# account and region the report shows, which no decision, episode or rollup row carries. Tag values are
# untrusted text, clipped to the column sizes (LABEL_SIZES).
instance_labels = Table(
    "instance_labels",
    metadata,
    Column("instance_id", String(64), primary_key=True),
    Column("owner", String(128)),
    Column("team", String(128)),
    Column("account", String(64)),
    Column("region", String(64)),
    Column("instance_type", String(64)),
    Column("gpu_model", String(64)),
    Column("gpu_count", Integer),
    Column("provider", String(32)),
    # How hourly_cost was found when it is not a price list or the bill ("estimate: ..." for a rented host
    # priced from the catalog, "node remainder: ..." for a Kubernetes node beside its workloads); "" otherwise.
    Column("price_source", String(160)),
    Column("first_seen", DateTime, nullable=False),
    Column("last_seen", DateTime, nullable=False, index=True),
)
LABEL_SIZES = {c.name: c.type.length for c in instance_labels.columns if isinstance(c.type, String)}
LABEL_UPDATED = ("owner", "team", "account", "region", "instance_type", "gpu_model", "gpu_count", "provider",
                 "price_source", "last_seen")  # first_seen is kept

# Last verdict per (instance, rule): what makes "act only on transitions" possible.
instance_state = Table(
    "instance_state",
    metadata,
    Column("instance_id", String(64), primary_key=True),
    Column("rule", String(128), primary_key=True),
    Column("verdict", String(16), nullable=False),
    Column("since", DateTime, nullable=False),
    Column("updated_at", DateTime, nullable=False),
    # Set when we stopped it (or, in dry-run, would have); cleared on the next verdict change.
    Column("stopped_at", DateTime),
    Column("stop_dry_run", Boolean),
)

marks = Table(
    "marks",
    metadata,
    Column("instance_id", String(64), primary_key=True),
    Column("rule", String(128), nullable=False),
    Column("marked_at", DateTime, nullable=False),
    Column("stop_at", DateTime, nullable=False),
    Column("reason", Text, nullable=False),
    Column("dry_run", Boolean, nullable=False),
    # When the warning was delivered; NULL while it is not (no stop before it is, and then not before
    # warned_at + the rule's lead: stop_at is moved accordingly).
    Column("warned_at", DateTime),
)

actions = Table(
    "actions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(32), nullable=False),
    Column("instance_id", String(64), nullable=False, index=True),
    Column("kind", String(16), nullable=False),
    Column("rule", String(128)),
    Column("dry_run", Boolean, nullable=False),
    # pending = intent written before the cloud call; done / failed after.
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("error", Text),
    Column("at", DateTime, nullable=False, index=True),
    Column("finished_at", DateTime),
)

notifications = Table(
    "notifications",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("channel", String(128), nullable=False),
    Column("text", Text, nullable=False),
    # pending (being sent, or fate unknown) | sent | outbox | failed (retried at next_attempt_at)
    # | abandoned (no longer to be sent: e.g. the warning of a stop that was cancelled before delivery)
    Column("status", String(16), nullable=False),
    Column("at", DateTime, nullable=False),
    Column("detail", Text),
    Column("attempts", Integer),
    Column("next_attempt_at", DateTime),
    Column("blocks", Text),  # the Block Kit JSON, so a failed message can be sent again as it was
)

# Statuses that mean a person can read the message.
DELIVERED_STATUSES = ("sent", "outbox")


# Small durable facts the service must remember across restarts
# (e.g. when the current "metrics unavailable" episode started).
kv = Table(
    "kv",
    metadata,
    Column("key", String(128), primary_key=True),
    Column("value", Text, nullable=False),
)

# The scheduler lease (gpufinops/lease.py): one row per lease name. Only the holder of the unexpired
# lease acts; `token` grows by one at every takeover, so a leader that lost it can prove it is stale.
leases = Table(
    "leases",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(255), nullable=False),
    Column("token", Integer, nullable=False),
    Column("acquired_at", DateTime, nullable=False),
    Column("renewed_at", DateTime, nullable=False),
    Column("expires_at", DateTime, nullable=False),
)


@dataclass(frozen=True)
class StateRow:
    instance_id: str
    rule: str
    verdict: Verdict
    since: datetime
    updated_at: datetime
    stopped_at: datetime | None
    stop_dry_run: bool | None = None  # whether that stop was a dry-run one


@dataclass(frozen=True)
class MarkRow:
    instance_id: str
    rule: str
    marked_at: datetime
    stop_at: datetime
    reason: str
    dry_run: bool
    warned_at: datetime | None = None


@dataclass(frozen=True)
class NotificationRow:
    key: str
    channel: str
    text: str
    status: str
    at: datetime  # when the status was last written; for sent/outbox rows, when it was delivered
    detail: str | None
    attempts: int
    next_attempt_at: datetime | None
    blocks: tuple[dict, ...]

    @property
    def delivered(self) -> bool:
        return self.status in DELIVERED_STATUSES


@dataclass(frozen=True)
class ActionRow:
    id: int
    run_id: str
    instance_id: str
    kind: ActionKind
    rule: str
    dry_run: bool
    status: str
    reason: str
    error: str | None
    at: datetime


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    # WAL: readers never block the writer; synchronous=NORMAL is durable across
    # process crashes (not power loss) and much faster than FULL.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.close()


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, future=True)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, future=True, pool_pre_ping=True)


def add_missing_columns(conn: Connection) -> list[str]:
    """Upgrade a database written by an older release: add the nullable columns it lacks (`create_all` only
    creates missing tables). Rows already stored keep their values; the new columns start NULL. Returns
    "table.column" for each column added. Runs on the caller's connection (inside its schema lock)."""
    added = []
    existing_tables = set(inspect(conn).get_table_names())
    quote = conn.dialect.identifier_preparer.quote
    for table in metadata.sorted_tables:
        if table.name not in existing_tables:
            continue
        have = {c["name"] for c in inspect(conn).get_columns(table.name)}
        for col in table.columns:
            if col.name in have:
                continue
            if not col.nullable:  # not additive: needs a hand-written migration
                raise RuntimeError(f"database table {table.name} lacks the NOT NULL column {col.name}")
            conn.execute(text(f"ALTER TABLE {quote(table.name)} ADD COLUMN {quote(col.name)} "
                              f"{col.type.compile(dialect=conn.dialect)}"))
            added.append(f"{table.name}.{col.name}")
    return added


# pg_advisory_xact_lock key that serialises schema creation between processes ("gpuf" in ASCII).
SCHEMA_LOCK_KEY = 0x67707566
SCHEMA_ATTEMPTS = 8  # SQLite: tries while another process holds the write lock past busy_timeout


def build_schema(conn: Connection) -> list[str]:
    """The whole schema check, on a connection that holds the schema lock in one transaction: the Alembic
    migrations up to head (gpufinops/store_migrations; a database from before Alembic is stamped at the
    baseline first), create_all for the tables capabilities define, the new nullable columns, then any
    backfill a migration left pending. Returns the columns added."""
    migrate(conn)
    metadata.create_all(conn)
    added = add_missing_columns(conn)
    backfill_rollups(conn)
    return added


def migrate(conn: Connection) -> str | None:
    """Upgrade to the newest revision; returns the revision found (None: none recorded). Alembic is imported
    only when there is something to do."""
    from .store_migrations import BASELINE, HEAD, SCRIPT_LOCATION

    tables = set(inspect(conn).get_table_names())
    current = (conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
               if "alembic_version" in tables else None)
    if current == HEAD:
        return current
    # Alembic's own INFO lines (plugin set-up at import, context) would land in every command's output; one
    # line of ours instead. Quieted before the import: the plugin lines are logged while importing.
    alembic_log = logging.getLogger("alembic")
    level = alembic_log.level
    alembic_log.setLevel(logging.WARNING)
    try:
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
        cfg.attributes["connection"] = conn
        if current is None and tables - {"alembic_version"}:
            command.stamp(cfg, BASELINE)  # tables written by create_all before Alembic: they are the baseline
        command.upgrade(cfg, "head")
    finally:
        alembic_log.setLevel(level)
    if tables - {"alembic_version"}:
        log.info("database schema upgraded from %s to %s", current or f"{BASELINE} (before migrations)", HEAD)
    return current


BACKFILL_WINDOW = timedelta(hours=6)


def backfill_rollups(conn: Connection) -> int:
    """Fold every stored decision row into episodes, rollups, tails and service runs, when a migration asked
    for it (kv BACKFILL_KEY), oldest first, six hours of ticks at a time. Returns the rows folded."""
    from .store_migrations import BACKFILL_KEY

    if conn.execute(select(kv.c.value).where(kv.c.key == BACKFILL_KEY)).scalar() is None:
        return 0
    lo, hi = conn.execute(select(func.min(decisions.c.evaluated_at), func.max(decisions.c.evaluated_at))).one()
    gap = stored_max_gap_s(conn)
    done, t = 0, lo
    log.info("folding the stored decisions (%s .. %s) into verdict episodes and hourly rollups", lo, hi)
    while t is not None and t <= hi:
        # The first window has no lower bound: on SQLite the bound is compared as text, and a row stored as
        # "2026-06-01 00:00:00" (written without fractional seconds) sorts before the bound's
        # "2026-06-01 00:00:00.000000", so `>= lo` would leave the oldest tick out of every rollup.
        in_window = [decisions.c.evaluated_at < t + BACKFILL_WINDOW] + ([decisions.c.evaluated_at >= t] if t > lo
                                                                         else [])
        q = select(decisions).where(*in_window).order_by(decisions.c.evaluated_at, decisions.c.id)
        rows = [dict(r) for r in conn.execute(q).mappings()]
        if rows:
            fold_into_store(conn, rows, gap)
            done += len(rows)
        t += BACKFILL_WINDOW
    conn.execute(delete(kv).where(kv.c.key == BACKFILL_KEY))
    return done


def stored_max_gap_s(conn: Connection) -> float:
    """2 x the median spacing of the latest stored ticks (the schedule that wrote them), for a backfill."""
    times = [r[0] for r in conn.execute(select(decisions.c.evaluated_at).distinct()
                                        .order_by(decisions.c.evaluated_at.desc()).limit(1000))]
    gaps = sorted((a - b).total_seconds() for a, b in zip(times, times[1:]))
    return 2 * gaps[len(gaps) // 2] if gaps else DEFAULT_MAX_GAP_S


def create_schema(engine: Engine) -> list[str]:
    """Migrations + create_all + add_missing_columns (build_schema), safe when several processes start on one
    fresh database at once.

    Without a lock, two processes both see a table missing and the second CREATE TABLE fails ("table
    decisions already exists" on SQLite, a pg_type unique violation on PostgreSQL). So the check and the
    creation run inside one lock: a transaction-scoped advisory lock on PostgreSQL, a BEGIN IMMEDIATE
    write transaction on SQLite (DDL is transactional on both). Returns the columns added."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
            return build_schema(conn)
    if engine.dialect.name != "sqlite":
        with engine.begin() as conn:
            return build_schema(conn)
    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            return sqlite_create_schema(engine)
        except OperationalError as exc:
            # "locked"/"busy": another process held the write lock past busy_timeout; try again.
            contended = "locked" in str(exc) or "busy" in str(exc)
            if not contended or attempt == SCHEMA_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * 2 ** attempt)
    raise AssertionError("unreachable")


def sqlite_create_schema(engine: Engine) -> list[str]:
    """One SQLite write transaction around the whole schema check and creation: BEGIN IMMEDIATE takes
    the database's write lock first, so a concurrent starter waits and then finds every table there."""
    # AUTOCOMMIT: pysqlite then sends no BEGIN of its own, and ours (IMMEDIATE) holds the lock.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            added = build_schema(conn)
        except BaseException:
            conn.exec_driver_sql("ROLLBACK")
            raise
        conn.exec_driver_sql("COMMIT")
        return added


DEFAULT_MAX_GAP_S = 120.0  # 2 x the default evaluate_every_s (60 s)
PRUNE_EVERY_S = 3600  # raw decision rows are pruned at most once an hour
PRUNED_AT_KEY = "store:raw_decisions_pruned_at"


def insert_rows(conn: Connection, table: Table, rows: Sequence[dict]) -> None:
    """INSERT many rows. On SQLite straight through the driver's executemany, with each value converted by
    its column type's own bind processor (the text SQLAlchemy would store): a tick of a large fleet, or an
    hour of them, is tens of thousands of rows and the generic path spends most of its time per row."""
    if conn.dialect.name != "sqlite" or not rows:
        conn.execute(insert(table), list(rows))
        return
    names = list(rows[0])
    convert = [(i, p) for i, p in enumerate(table.c[n].type.bind_processor(conn.dialect) for n in names)
               if p is not None]
    values = itemgetter(*names)
    quote = conn.dialect.identifier_preparer.quote
    sql = (f"INSERT INTO {conn.dialect.identifier_preparer.format_table(table)} "
           f"({', '.join(quote(n) for n in names)}) VALUES ({', '.join('?' * len(names))})")
    params = []
    for r in rows:
        v = list(values(r))
        for i, p in convert:
            if v[i] is not None:
                v[i] = p(v[i])
        params.append(tuple(v))
    conn.exec_driver_sql(sql, params)


def load_heads(conn: Connection, instance_ids: Sequence[str], since: datetime) -> Heads:
    """The latest episode per (instance, rule) seen since `since` (an older one cannot be extended: the gap is
    too long), the tails of these instances and the latest service run."""
    heads = Heads()
    ids = sorted(set(instance_ids))
    for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
        latest = (select(func.max(verdict_episodes.c.id))
                  .where(verdict_episodes.c.instance_id.in_(chunk), verdict_episodes.c.last_seen_at >= since)
                  .group_by(verdict_episodes.c.instance_id, verdict_episodes.c.rule))
        for r in conn.execute(select(verdict_episodes).where(verdict_episodes.c.id.in_(latest))).mappings():
            heads.episodes[(r["instance_id"], r["rule"])] = Episode(
                r["instance_id"], r["rule"], r["verdict"], r["code"], r["started_at"], r["last_seen_at"], r["ticks"],
                r["reason"], r["stats"], r["hourly_cost"], r["team"], r["instance_type"], r["dry_run"], id=r["id"])
        for r in conn.execute(select(verdict_tails).where(verdict_tails.c.instance_id.in_(chunk))).mappings():
            heads.tails[r["instance_id"]] = Tail(**{k: r[k] for k in TAIL_FIELDS})
    r = conn.execute(select(service_runs).order_by(service_runs.c.id.desc()).limit(1)).mappings().first()
    if r is not None:
        heads.run = Run(r["started_at"], r["last_seen_at"], r["ticks"], id=r["id"])
    return heads


TAIL_FIELDS = ("instance_id", "at", "verdict", "code", "hourly_cost", "team", "instance_type", "activity_mean",
               "activity_max", "memory_max_mib", "evaluations")
EPISODE_FIELDS = ("instance_id", "rule", "verdict", "code", "started_at", "last_seen_at", "ticks", "reason", "stats",
                  "hourly_cost", "team", "instance_type", "dry_run")
HOUR_KEY_FIELDS = ("hour", "instance_id", "verdict", "code", "measured", "hourly_cost", "team", "instance_type")
HOUR_AGG_FIELDS = ("hours", "ticks", "evaluations", "activity_hours", "activity_max", "memory_max_mib",
                   "after_stop_hours")
STOP_KINDS = ("stop", "terminate")


def completed_stops(conn: Connection, heads: Heads) -> dict[str, list[datetime]]:
    """Completed real stops of the instances whose tails are about to be rolled up, since their tails' ticks."""
    if not heads.tails:
        return {}
    since = min(t.at for t in heads.tails.values())
    ids = sorted(heads.tails)
    out: dict[str, list[datetime]] = {}
    for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
        q = (select(actions.c.instance_id, actions.c.at)
             .where(actions.c.instance_id.in_(chunk), actions.c.kind.in_(STOP_KINDS), actions.c.dry_run.is_(False),
                    actions.c.status == "done", actions.c.at >= since).order_by(actions.c.at))
        for inst, at in conn.execute(q):
            out.setdefault(inst, []).append(at)
    return out


def fold_into_store(conn: Connection, rows: Sequence[dict], max_gap_s: float) -> None:
    """Fold decision rows into the stored episodes, tails, service runs and hourly rollups (one connection,
    the caller's transaction)."""
    since = min(r["evaluated_at"] for r in rows) - timedelta(seconds=max_gap_s)
    heads = load_heads(conn, [r["instance_id"] for r in rows], since)
    hours = fold_ticks(rows, heads, max_gap_s, completed_stops(conn, heads))
    changed = [e.settle() for e in heads.episodes.values() if e.changed and e.id is not None]
    if changed:
        conn.execute(update(verdict_episodes).where(verdict_episodes.c.id == bindparam("ep_id"))
                     .values(**{f: bindparam(f"v_{f}") for f in ("last_seen_at", "ticks", "reason", "stats",
                                                                   "hourly_cost", "team", "instance_type")}),
                     [{"ep_id": e.id, **{f"v_{f}": getattr(e, f) for f in ("last_seen_at", "ticks", "reason", "stats",
                                                                           "hourly_cost", "team", "instance_type")}}
                      for e in changed])
    if heads.new_episodes:
        conn.execute(insert(verdict_episodes), [{f: getattr(e.settle(), f) for f in EPISODE_FIELDS}
                                                for e in heads.new_episodes])
    runs = [r for r in ([heads.run] if heads.run is not None else []) if r.changed and r.id is not None]
    for run in runs:
        conn.execute(update(service_runs).where(service_runs.c.id == run.id)
                     .values(last_seen_at=run.last_seen_at, ticks=run.ticks))
    if heads.new_runs:
        conn.execute(insert(service_runs), [{"started_at": r.started_at, "last_seen_at": r.last_seen_at,
                                             "ticks": r.ticks} for r in heads.new_runs])
    if heads.changed_tails:
        ids = sorted(heads.changed_tails)
        for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
            conn.execute(delete(verdict_tails).where(verdict_tails.c.instance_id.in_(chunk)))
        conn.execute(insert(verdict_tails), [{f: getattr(heads.tails[i], f) for f in TAIL_FIELDS} for i in ids])
    if hours:
        upsert_hours(conn, hours)


def upsert_hours(conn: Connection, hours: dict) -> None:
    """Add hour aggregates to the stored rollups: the rows of the hours and instances touched are read once,
    summed in, and written back (updates by id, inserts for new keys)."""
    first_hour = min(k[0] for k in hours)
    instances = sorted({k[1] for k in hours})
    stored: dict[tuple, tuple[int, HourAgg]] = {}
    for chunk in (instances[i:i + 500] for i in range(0, len(instances), 500)):
        q = select(verdict_hours).where(verdict_hours.c.hour >= first_hour, verdict_hours.c.instance_id.in_(chunk))
        for r in conn.execute(q).mappings():
            stored[tuple(r[f] for f in HOUR_KEY_FIELDS)] = (r["id"], HourAgg(*(r[f] for f in HOUR_AGG_FIELDS)))
    updates, inserts = [], []
    for key, agg in hours.items():
        if key in stored:
            row_id, have = stored[key]
            have.add(agg)
            updates.append({"row_id": row_id, **{f"v_{f}": getattr(have, f) for f in HOUR_AGG_FIELDS}})
        else:
            inserts.append({**dict(zip(HOUR_KEY_FIELDS, key)), **{f: getattr(agg, f) for f in HOUR_AGG_FIELDS}})
    if updates:
        conn.execute(update(verdict_hours).where(verdict_hours.c.id == bindparam("row_id"))
                     .values(**{f: bindparam(f"v_{f}") for f in HOUR_AGG_FIELDS}), updates)
    if inserts:
        conn.execute(insert(verdict_hours), inserts)


def label_row(inst: GpuInstance, now: datetime) -> dict:
    """One instance_labels row: owner and team as the messages read them (GpuInstance.owner(), .team()), every
    text clipped to its column (tag values are whatever a person typed)."""
    def clip(name: str, value) -> str:
        return str(value or "")[:LABEL_SIZES[name]]

    seen = naive_utc(now)
    return {"instance_id": clip("instance_id", inst.instance_id), "owner": clip("owner", inst.owner()),
            "team": clip("team", inst.team()), "account": clip("account", inst.account),
            "region": clip("region", inst.region), "instance_type": clip("instance_type", inst.instance_type),
            "gpu_model": clip("gpu_model", inst.gpu_model), "gpu_count": int(inst.gpu_count or 0),
            "provider": clip("provider", inst.provider), "price_source": clip("price_source", inst.price_source),
            "first_seen": seen, "last_seen": seen}


def upsert_labels(conn: Connection, rows: Sequence[dict]) -> None:
    """Insert new instances, update the labels and last_seen of known ones, first_seen kept: one INSERT ... ON
    CONFLICT statement on SQLite and PostgreSQL; elsewhere one read of the known ids, then batched updates and
    inserts."""
    if conn.dialect.name in ("sqlite", "postgresql"):
        if conn.dialect.name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as dialect_insert
        else:
            from sqlalchemy.dialects.postgresql import insert as dialect_insert
        stmt = dialect_insert(instance_labels)
        conn.execute(stmt.on_conflict_do_update(index_elements=[instance_labels.c.instance_id],
                                                set_={f: stmt.excluded[f] for f in LABEL_UPDATED}), list(rows))
        return
    ids = sorted(r["instance_id"] for r in rows)
    known: set[str] = set()
    for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
        known.update(conn.execute(select(instance_labels.c.instance_id)
                                  .where(instance_labels.c.instance_id.in_(chunk))).scalars())
    updates = [{"label_id": r["instance_id"], **{f"v_{f}": r[f] for f in LABEL_UPDATED}}
               for r in rows if r["instance_id"] in known]
    if updates:
        conn.execute(update(instance_labels).where(instance_labels.c.instance_id == bindparam("label_id"))
                     .values(**{f: bindparam(f"v_{f}") for f in LABEL_UPDATED}), updates)
    inserts = [r for r in rows if r["instance_id"] not in known]
    if inserts:
        conn.execute(insert(instance_labels), inserts)


def prune_raw_decisions(conn: Connection, now: datetime, keep_s: float) -> int:
    """Delete raw decision rows older than keep_s before `now`, at most once an hour (noted in kv). Their
    time is already in the episodes and rollups, written in the transaction that stored them."""
    from .store_migrations import BACKFILL_KEY

    if conn.execute(select(kv.c.value).where(kv.c.key == BACKFILL_KEY)).scalar() is not None:
        return 0  # stored rows not yet folded into rollups: keep them all
    last = conn.execute(select(kv.c.value).where(kv.c.key == PRUNED_AT_KEY)).scalar()
    if last is not None and (now - datetime.fromisoformat(last)).total_seconds() < PRUNE_EVERY_S:
        return 0
    res = conn.execute(delete(decisions).where(decisions.c.evaluated_at < now - timedelta(seconds=keep_s)))
    conn.execute(delete(kv).where(kv.c.key == PRUNED_AT_KEY))
    conn.execute(insert(kv).values(key=PRUNED_AT_KEY, value=now.isoformat()))
    return int(res.rowcount or 0)


class Store:
    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        create_schema(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------- decisions
    def record_decisions(
        self,
        run_id: str,
        items: Sequence[Decision],
        dry_run: bool,
        teams: dict[str, str] | None = None,
        types: dict[str, str] | None = None,
        *,
        max_gap_s: float = DEFAULT_MAX_GAP_S,
        raw_keep_s: float | None = None,
    ) -> None:
        """Record a tick's decisions (or many ticks', in any order) in one transaction: the raw rows, the
        verdict episodes, the hourly rollups and the service run they extend (gpufinops/episodes.py).

        max_gap_s: a longer gap between two ticks of an instance is time nobody watched (2 x evaluate_every_s).
        raw_keep_s: raw rows older than this before the newest tick are deleted, at most once an hour (their
        episodes and rollups are already stored); None keeps them all."""
        if not items:
            return
        teams = teams or {}
        types = types or {}
        rows = [
            {
                "run_id": run_id,
                "instance_id": d.instance_id,
                "rule": d.rule_name,
                "verdict": d.verdict.value,
                "code": d.code.value,
                "reason": d.reason,
                "evaluated_at": naive_utc(d.evaluated_at),
                "window_s": d.window_s,
                "activity_mean": d.activity_mean,
                "activity_max": d.activity_max,
                "memory_max_mib": d.memory_max_mib,
                "coverage": d.coverage,
                "hourly_cost": d.hourly_cost,
                "team": teams.get(d.instance_id),
                "instance_type": types.get(d.instance_id),
                "dry_run": dry_run,
            }
            for d in items
        ]
        with self.engine.begin() as conn:
            insert_rows(conn, decisions, rows)
            fold_into_store(conn, rows, max_gap_s)
            if raw_keep_s is not None:
                prune_raw_decisions(conn, max(r["evaluated_at"] for r in rows), raw_keep_s)

    def decision_rows(self, start: datetime | None = None, end: datetime | None = None,
                      instance_id: str | None = None) -> list[dict]:
        q = select(decisions).order_by(decisions.c.evaluated_at, decisions.c.id)
        if instance_id is not None:
            q = q.where(decisions.c.instance_id == instance_id)
        if start is not None:
            q = q.where(decisions.c.evaluated_at >= naive_utc(start))
        if end is not None:
            q = q.where(decisions.c.evaluated_at < naive_utc(end))
        with self.engine.connect() as conn:
            out = []
            for r in conn.execute(q).mappings():
                d = dict(r)
                d["evaluated_at"] = aware_utc(d["evaluated_at"])
                out.append(d)
            return out

    def decision_frame(self, start: datetime | None = None, end: datetime | None = None,
                       columns: Sequence[str] | None = None):
        """decision_rows() as one pandas DataFrame (evaluated_at aware UTC): one read, no per-row
        Python objects, for reports and cost joins over months of decisions. By default without the
        long `reason` text and the run id, which no aggregate needs."""
        import pandas as pd

        names = columns or [c.name for c in decisions.columns if c.name not in ("reason", "run_id")]
        q = select(*(decisions.c[n] for n in names)).order_by(decisions.c.evaluated_at, decisions.c.id)
        if start is not None:
            q = q.where(decisions.c.evaluated_at >= naive_utc(start))
        if end is not None:
            q = q.where(decisions.c.evaluated_at < naive_utc(end))
        with self.engine.connect() as conn:
            frame = pd.read_sql_query(q, conn)
        frame["evaluated_at"] = pd.to_datetime(frame["evaluated_at"], utc=True)
        return frame

    # ------------------------------------------------------------- instance labels
    def record_instances(self, instances: Iterable[GpuInstance], now: datetime) -> int:
        """Upsert what this tick's inventory listed of each instance (owner, team, account, region, type, GPUs)
        into instance_labels, in one transaction and one statement batch. Returns the rows written."""
        rows = list({r["instance_id"]: r for r in (label_row(i, now) for i in instances)}.values())
        if not rows:
            return 0
        with self.engine.begin() as conn:
            upsert_labels(conn, rows)
        return len(rows)

    def instance_labels(self, instance_ids: Iterable[str] | None = None) -> dict[str, dict]:
        """The stored labels by instance id (first_seen / last_seen aware UTC); all of them without ids."""
        q = select(instance_labels)
        ids = None if instance_ids is None else sorted(set(instance_ids))
        chunks = [q] if ids is None else [q.where(instance_labels.c.instance_id.in_(ids[i:i + 500]))
                                            for i in range(0, len(ids), 500)]
        out: dict[str, dict] = {}
        with self.engine.connect() as conn:
            for chunk in chunks:
                for r in conn.execute(chunk).mappings():
                    out[r["instance_id"]] = {**r, "first_seen": aware_utc(r["first_seen"]),
                                             "last_seen": aware_utc(r["last_seen"])}
        return out

    # ------------------------------------------------------------- episodes and rollups
    def verdict_hours_frame(self, start: datetime, end: datetime, grain: str = "hour"):
        """Time in each verdict in [start, end), from the hourly rollups plus each instance's tail (its latest
        tick, whose `hours` is NaN: the reader counts it up to its own end, at most max_gap_s).

        grain="hour": one row per hour and key, `at` = the hour; grain="period": summed over the period in SQL
        (`at` = the first hour). Columns: instance_id, team, instance_type, verdict, code, measured,
        hourly_cost, at, hours, ticks, evaluations, activity_hours, activity_max, memory_max_mib,
        after_stop_hours, open (a tail). Hours are counted from the hour `start` falls in, up to the hour
        before `end` (exact for an `end` on the hour or after the latest tick, e.g. now)."""
        import pandas as pd

        h = verdict_hours.c
        keys = [h.instance_id, h.team, h.instance_type, h.verdict, h.code, h.measured, h.hourly_cost]
        where = (h.hour >= naive_utc(start).replace(minute=0, second=0, microsecond=0), h.hour < naive_utc(end))
        if grain == "hour":
            q = select(*keys, h.hour.label("at"), h.hours, h.ticks, h.evaluations, h.activity_hours, h.activity_max,
                       h.memory_max_mib, h.after_stop_hours).where(*where)
        elif grain == "period":
            q = (select(*keys, func.min(h.hour).label("at"), func.sum(h.hours).label("hours"),
                        func.sum(h.ticks).label("ticks"), func.sum(h.evaluations).label("evaluations"),
                        func.sum(h.activity_hours).label("activity_hours"),
                        func.max(h.activity_max).label("activity_max"),
                        func.max(h.memory_max_mib).label("memory_max_mib"),
                        func.sum(h.after_stop_hours).label("after_stop_hours")).where(*where).group_by(*keys))
        else:
            raise ValueError(f"grain must be hour or period, not {grain!r}")
        t = verdict_tails.c
        tq = (select(t.instance_id, t.team, t.instance_type, t.verdict, t.code, t.activity_mean, t.hourly_cost,
                     t.at, t.evaluations, t.activity_max, t.memory_max_mib)
              .where(t.at >= naive_utc(start), t.at < naive_utc(end)))
        with self.engine.connect() as conn:
            rolled = pd.read_sql_query(q, conn)
            tails = pd.read_sql_query(tq, conn)
        tails = tails.assign(measured=tails["activity_mean"].notna(), hours=float("nan"), ticks=1,
                             activity_hours=tails["activity_mean"],  # x hours once they are known
                             after_stop_hours=0.0)  # a tail's stop is applied by the report itself
        frame = pd.concat([rolled, tails[rolled.columns.tolist() + ["activity_mean"]]], ignore_index=True) \
            if len(tails) else rolled.assign(activity_mean=float("nan"))
        frame["at"] = pd.to_datetime(frame["at"], utc=True)
        frame["measured"] = frame["measured"].astype(bool)
        for c in ("hours", "activity_hours", "activity_max", "memory_max_mib", "hourly_cost", "activity_mean",
                  "after_stop_hours"):
            frame[c] = pd.to_numeric(frame[c], errors="coerce").astype("float64")
        frame["open"] = frame["hours"].isna()
        return frame

    def episode_frame(self, start: datetime | None = None, end: datetime | None = None,
                      instance_ids: Iterable[str] | None = None, with_reason: bool = False):
        """Verdict episodes that overlap [start, end), oldest first (aware UTC times)."""
        import pandas as pd

        e = verdict_episodes.c
        cols = [e.id, e.instance_id, e.rule, e.verdict, e.code, e.started_at, e.last_seen_at, e.ticks, e.hourly_cost,
                e.team, e.instance_type, e.dry_run] + ([e.reason, e.stats] if with_reason else [])
        q = select(*cols).order_by(e.started_at, e.id)
        if start is not None:
            q = q.where(e.last_seen_at >= naive_utc(start))
        if end is not None:
            q = q.where(e.started_at < naive_utc(end))
        if instance_ids is not None:
            q = q.where(e.instance_id.in_(sorted(set(instance_ids))))
        with self.engine.connect() as conn:
            frame = pd.read_sql_query(q, conn)
        for c in ("started_at", "last_seen_at"):
            frame[c] = pd.to_datetime(frame[c], utc=True)
        return frame

    def verdict_history(self, start: datetime | None = None, end: datetime | None = None,
                        instance_id: str | None = None) -> list[dict]:
        """The verdict episodes as audit rows, oldest first: evaluated_at (when the verdict began), rule,
        verdict, code, dry_run, and the latest reason with how long it held. Complete for every month stored,
        unlike the raw decision rows (kept for StoreSettings.raw_decisions_days)."""
        e = verdict_episodes.c
        q = select(verdict_episodes).order_by(e.started_at, e.id)
        if instance_id is not None:
            q = q.where(e.instance_id == instance_id)
        if start is not None:
            q = q.where(e.last_seen_at >= naive_utc(start))
        if end is not None:
            q = q.where(e.started_at < naive_utc(end))
        with self.engine.connect() as conn:
            rows = conn.execute(q).mappings().all()
        return [{"evaluated_at": aware_utc(r["started_at"]), "last_seen_at": aware_utc(r["last_seen_at"]),
                 "instance_id": r["instance_id"], "rule": r["rule"], "verdict": r["verdict"], "code": r["code"],
                 "dry_run": r["dry_run"], "ticks": r["ticks"],
                 "reason": f"{r['reason']} [{r['ticks']} evaluation(s) until {r['last_seen_at']:%Y-%m-%d %H:%M} UTC]"}
                for r in rows]

    def service_run_frame(self, start: datetime | None = None, end: datetime | None = None):
        """Stretches in which the service evaluated anything, that overlap [start, end) (aware UTC)."""
        import pandas as pd

        r = service_runs.c
        q = select(r.started_at, r.last_seen_at, r.ticks).order_by(r.started_at)
        if start is not None:
            q = q.where(r.last_seen_at >= naive_utc(start))
        if end is not None:
            q = q.where(r.started_at < naive_utc(end))
        with self.engine.connect() as conn:
            frame = pd.read_sql_query(q, conn)
        for c in ("started_at", "last_seen_at"):
            frame[c] = pd.to_datetime(frame[c], utc=True)
        return frame

    # ------------------------------------------------------------- state
    def get_state(self, instance_id: str, rule: str) -> StateRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(
                select(instance_state).where(
                    instance_state.c.instance_id == instance_id, instance_state.c.rule == rule
                )
            ).mappings().first()
        if r is None:
            return None
        return StateRow(
            r["instance_id"], r["rule"], Verdict(r["verdict"]), aware_utc(r["since"]),
            aware_utc(r["updated_at"]), aware_utc(r["stopped_at"]), r["stop_dry_run"],
        )

    def put_state(
        self, instance_id: str, rule: str, verdict: Verdict, since: datetime, now: datetime,
        stopped_at: datetime | None, stop_dry_run: bool | None = None,
    ) -> None:
        values = {
            "verdict": verdict.value,
            "since": naive_utc(since),
            "updated_at": naive_utc(now),
            "stopped_at": naive_utc(stopped_at),
            "stop_dry_run": stop_dry_run if stopped_at is not None else None,
        }
        with self.engine.begin() as conn:
            res = conn.execute(
                update(instance_state)
                .where(instance_state.c.instance_id == instance_id, instance_state.c.rule == rule)
                .values(**values)
            )
            if res.rowcount == 0:
                conn.execute(insert(instance_state).values(instance_id=instance_id, rule=rule, **values))

    # ------------------------------------------------------------- marks
    def get_mark(self, instance_id: str) -> MarkRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(select(marks).where(marks.c.instance_id == instance_id)).mappings().first()
        if r is None:
            return None
        return _mark_row(r)

    def all_marks(self) -> list[MarkRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(marks)).mappings().all()
        return [_mark_row(r) for r in rows]

    def put_mark(self, m: MarkRow) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(marks).where(marks.c.instance_id == m.instance_id))
            conn.execute(
                insert(marks).values(
                    instance_id=m.instance_id, rule=m.rule, marked_at=naive_utc(m.marked_at),
                    stop_at=naive_utc(m.stop_at), reason=m.reason, dry_run=m.dry_run,
                    warned_at=naive_utc(m.warned_at),
                )
            )

    def clear_mark(self, instance_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(marks).where(marks.c.instance_id == instance_id))

    # ------------------------------------------------------------- actions
    def begin_action(
        self, run_id: str, instance_id: str, kind: ActionKind, rule: str, dry_run: bool, reason: str, at: datetime
    ) -> int:
        """Write the intent before touching the cloud, so a crash leaves a trace to reconcile."""
        with self.engine.begin() as conn:
            res = conn.execute(
                insert(actions).values(
                    run_id=run_id, instance_id=instance_id, kind=kind.value, rule=rule, dry_run=dry_run,
                    status="pending", reason=reason, at=naive_utc(at),
                )
            )
            return int(res.inserted_primary_key[0])

    def finish_action(self, action_id: int, ok: bool, at: datetime, error: str | None = None, status: str | None = None) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(actions)
                .where(actions.c.id == action_id)
                # error None keeps what an earlier step noted (an "applied" row finished after its bookkeeping).
                .values(status=status or ("done" if ok else "failed"), finished_at=naive_utc(at),
                        **({} if error is None else {"error": error}))
            )

    def record_action(self, run_id: str, result: ActionResult) -> None:
        """An action that needs no two-step intent (skip, notify, dry-run)."""
        with self.engine.begin() as conn:
            conn.execute(
                insert(actions).values(
                    run_id=run_id, instance_id=result.instance_id, kind=result.kind.value, rule=result.rule_name,
                    dry_run=result.dry_run, status="done" if result.ok else "failed", reason=result.reason,
                    error=result.error, at=naive_utc(result.at), finished_at=naive_utc(result.at),
                )
            )

    def action_rows(self, status: str | Sequence[str] | None = None, kinds: Iterable[ActionKind] | None = None,
                    start: datetime | None = None, end: datetime | None = None,
                    instance_id: str | None = None) -> list[ActionRow]:
        q = select(actions).order_by(actions.c.at, actions.c.id)
        if instance_id is not None:
            q = q.where(actions.c.instance_id == instance_id)
        if status:
            q = q.where(actions.c.status.in_((status,) if isinstance(status, str) else tuple(status)))
        if kinds:
            q = q.where(actions.c.kind.in_([k.value for k in kinds]))
        if start is not None:
            q = q.where(actions.c.at >= naive_utc(start))
        if end is not None:
            q = q.where(actions.c.at < naive_utc(end))
        with self.engine.connect() as conn:
            rows = conn.execute(q).mappings().all()
        return [
            ActionRow(r["id"], r["run_id"], r["instance_id"], ActionKind(r["kind"]), r["rule"] or "", r["dry_run"],
                      r["status"], r["reason"], r["error"], aware_utc(r["at"]))
            for r in rows
        ]

    # ------------------------------------------------------------- notifications
    def notification_sent(self, key: str) -> bool:
        """Delivered (Slack ok, found by lookup, or in the outbox). A pending key is not: its fate is looked
        up before any second post (notify.py)."""
        row = self.get_notification(key)
        return row is not None and row.delivered

    def get_notification(self, key: str) -> NotificationRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(select(notifications).where(notifications.c.key == key)).mappings().first()
        return None if r is None else _notification_row(r)

    def delivered_at(self, key: str) -> datetime | None:
        """When the message with this key was delivered; None while it is not."""
        row = self.get_notification(key)
        return row.at if row is not None and row.delivered else None

    def notifications_due(self, now: datetime, limit: int = 100, skip_prefix: str = "warn:") -> list[NotificationRow]:
        """Failed messages whose backoff is over, oldest first. Stop warnings are left out: the act stage
        sends them again itself, with the stop time counted from that try."""
        q = (select(notifications)
             .where(notifications.c.status == "failed", ~notifications.c.key.startswith(skip_prefix, autoescape=True),
                    (notifications.c.next_attempt_at.is_(None)) | (notifications.c.next_attempt_at <= naive_utc(now)))
             .order_by(notifications.c.at).limit(limit))
        with self.engine.connect() as conn:
            return [_notification_row(r) for r in conn.execute(q).mappings()]

    def undelivered_count(self) -> int:
        """Messages that failed and wait for another try (for health and /metrics)."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(notifications)
                                    .where(notifications.c.status == "failed")).scalar_one())

    def abandon_notification(self, key: str, at: datetime, why: str) -> None:
        """Never send this message any more (unless already delivered)."""
        with self.engine.begin() as conn:
            conn.execute(update(notifications)
                         .where(notifications.c.key == key, notifications.c.status.in_(("pending", "failed")))
                         .values(status="abandoned", at=naive_utc(at), detail=why[:500]))

    def record_notification(self, key: str, channel: str, text: str, status: str, at: datetime,
                            detail: str | None = None, *, blocks: Sequence[dict] | None = None,
                            attempts: int | None = None, next_attempt_at: datetime | None = None) -> None:
        values = dict(key=key, channel=channel, text=text, status=status, at=naive_utc(at), detail=detail,
                      attempts=attempts, next_attempt_at=naive_utc(next_attempt_at),
                      blocks=json.dumps(list(blocks), default=str) if blocks else None)
        with self.engine.begin() as conn:
            conn.execute(delete(notifications).where(notifications.c.key == key))
            conn.execute(insert(notifications).values(**values))

    def notification_rows(self) -> list[dict]:
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(select(notifications).order_by(notifications.c.at)).mappings()]


    # ------------------------------------------------------------- kv
    def get_kv(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            r = conn.execute(select(kv.c.value).where(kv.c.key == key)).first()
        return None if r is None else r[0]

    def kv_items(self, prefix: str) -> list[tuple[str, str]]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(kv.c.key, kv.c.value).where(kv.c.key.startswith(prefix, autoescape=True))
                                .order_by(kv.c.key)).all()
        return [(r[0], r[1]) for r in rows]

    def set_kv(self, key: str, value: str | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(kv).where(kv.c.key == key))
            if value is not None:
                conn.execute(insert(kv).values(key=key, value=value))

    def claim_kv(self, key: str, value: str) -> bool:
        """Write key only if nobody holds it yet: True for the one caller whose INSERT wins, False when the key
        exists (the primary key refuses the second row, so two concurrent claims cannot both win, on SQLite as
        on PostgreSQL; a get-then-set could)."""
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(kv).values(key=key, value=value))
        except IntegrityError:
            return False
        return True


def _mark_row(r) -> MarkRow:
    return MarkRow(r["instance_id"], r["rule"], aware_utc(r["marked_at"]), aware_utc(r["stop_at"]), r["reason"],
                   r["dry_run"], aware_utc(r["warned_at"]))


def _notification_row(r) -> NotificationRow:
    try:
        blocks = tuple(json.loads(r["blocks"])) if r["blocks"] else ()
    except ValueError:
        blocks = ()
    return NotificationRow(r["key"], r["channel"], r["text"], r["status"], aware_utc(r["at"]), r["detail"],
                           int(r["attempts"] or 0), aware_utc(r["next_attempt_at"]), blocks)


__all__ = ["Store", "metadata", "leases", "create_schema", "StateRow", "MarkRow", "ActionRow", "NotificationRow", "make_engine", "aware_utc", "naive_utc"]
