"""The engine (SQLite WAL pragmas or Postgres by URL) and the schema on start: Alembic migrations
(store/migrations), create_all, the nullable columns an older release lacks, the rollup backfill; all under one
schema lock so several processes can start on one database.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from sqlalchemy import create_engine, delete, event, func, inspect, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from .rollups import DEFAULT_MAX_GAP_S, fold_into_store
from .schema import decisions, kv, metadata

log = logging.getLogger("gpufinops.store")


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
    from .migrations import BASELINE, HEAD, SCRIPT_LOCATION

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
    from .migrations import BACKFILL_KEY

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
