"""The database: audit log of decisions, marks, actions, notifications, state.

SQLite (file, WAL) by default; any SQLAlchemy URL (postgresql://...) works.
Capabilities (billing, recommend, ...) define their own tables on the shared
`metadata` and get them created by the same Store.
"""

from __future__ import annotations

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
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

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
    Column("status", String(16), nullable=False),  # pending | sent | outbox | failed
    Column("at", DateTime, nullable=False),
    Column("detail", Text),
)


# Small durable facts the service must remember across restarts
# (e.g. when the current "metrics unavailable" episode started).
kv = Table(
    "kv",
    metadata,
    Column("key", String(128), primary_key=True),
    Column("value", Text, nullable=False),
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


def add_missing_columns(engine: Engine) -> list[str]:
    """Upgrade a database written by an older release: add the nullable columns it lacks (`create_all` only
    creates missing tables). Rows already stored keep their values; the new columns start NULL. Returns
    "table.column" for each column added."""
    added = []
    existing_tables = set(inspect(engine).get_table_names())
    quote = engine.dialect.identifier_preparer.quote
    with engine.begin() as conn:
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
                                  f"{col.type.compile(dialect=engine.dialect)}"))
                added.append(f"{table.name}.{col.name}")
    return added


class Store:
    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        metadata.create_all(self.engine)
        add_missing_columns(self.engine)

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
        return MarkRow(r["instance_id"], r["rule"], aware_utc(r["marked_at"]), aware_utc(r["stop_at"]), r["reason"], r["dry_run"])

    def all_marks(self) -> list[MarkRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(marks)).mappings().all()
        return [MarkRow(r["instance_id"], r["rule"], aware_utc(r["marked_at"]), aware_utc(r["stop_at"]), r["reason"], r["dry_run"]) for r in rows]

    def put_mark(self, m: MarkRow) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(marks).where(marks.c.instance_id == m.instance_id))
            conn.execute(
                insert(marks).values(
                    instance_id=m.instance_id, rule=m.rule, marked_at=naive_utc(m.marked_at),
                    stop_at=naive_utc(m.stop_at), reason=m.reason, dry_run=m.dry_run,
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
                .values(status=status or ("done" if ok else "failed"), error=error, finished_at=naive_utc(at))
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

    def action_rows(self, status: str | None = None, kinds: Iterable[ActionKind] | None = None,
                    start: datetime | None = None, end: datetime | None = None,
                    instance_id: str | None = None) -> list[ActionRow]:
        q = select(actions).order_by(actions.c.at, actions.c.id)
        if instance_id is not None:
            q = q.where(actions.c.instance_id == instance_id)
        if status:
            q = q.where(actions.c.status == status)
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
        with self.engine.connect() as conn:
            r = conn.execute(
                select(notifications.c.status).where(notifications.c.key == key)
            ).first()
        # "pending" counts as sent: a crash between Slack accepting a message and
        # us recording it must not produce a second copy (at-most-once).
        return r is not None and r[0] in ("pending", "sent", "outbox")

    def claim_notification(self, key: str, channel: str, text: str, at: datetime) -> bool:
        """Atomically take the right to send `key`: True for exactly one caller.

        The primary key makes the insert fail for a second claimant (another process on
        the same database included); a key whose earlier attempt failed may be claimed again.
        """
        row = dict(key=key, channel=channel, text=text, status="pending", at=naive_utc(at))
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(notifications).values(**row))
            return True
        except IntegrityError:
            with self.engine.begin() as conn:
                res = conn.execute(
                    update(notifications)
                    .where(notifications.c.key == key, notifications.c.status == "failed")
                    .values(status="pending", at=naive_utc(at))
                )
                return res.rowcount == 1

    def record_notification(self, key: str, channel: str, text: str, status: str, at: datetime, detail: str | None = None) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(notifications).where(notifications.c.key == key))
            conn.execute(
                insert(notifications).values(key=key, channel=channel, text=text, status=status, at=naive_utc(at), detail=detail)
            )

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


__all__ = ["Store", "metadata", "StateRow", "MarkRow", "ActionRow", "make_engine", "aware_utc", "naive_utc"]
