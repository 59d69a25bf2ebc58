"""The database: audit log of decisions, marks, actions, notifications, state.

SQLite (file, WAL) by default; any SQLAlchemy URL (postgresql://...) works.
Capabilities (billing, recommend, ...) define their own tables on the shared
`metadata` and get them created by the same Store.
"""

from __future__ import annotations

import time
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable, Sequence

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
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
from sqlalchemy.exc import OperationalError

from .model import ActionKind, ActionResult, Decision, Verdict

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


def create_schema(engine: Engine) -> list[str]:
    """create_all + add_missing_columns, safe when several processes start on one fresh database at once.

    Without a lock, two processes both see a table missing and the second CREATE TABLE fails ("table
    decisions already exists" on SQLite, a pg_type unique violation on PostgreSQL). So the check and the
    creation run inside one lock: a transaction-scoped advisory lock on PostgreSQL, a BEGIN IMMEDIATE
    write transaction on SQLite (DDL is transactional on both). Returns the columns added."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
            metadata.create_all(conn)
            return add_missing_columns(conn)
    if engine.dialect.name != "sqlite":
        with engine.begin() as conn:
            metadata.create_all(conn)
            return add_missing_columns(conn)
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
            metadata.create_all(conn)
            added = add_missing_columns(conn)
        except BaseException:
            conn.exec_driver_sql("ROLLBACK")
            raise
        conn.exec_driver_sql("COMMIT")
        return added


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
    ) -> None:
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
            conn.execute(insert(decisions), rows)

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
