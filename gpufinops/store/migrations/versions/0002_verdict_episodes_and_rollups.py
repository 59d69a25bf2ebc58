"""Verdict episodes, hourly rollups, tails and service runs (gpufinops/episodes.py), backfilled from the
decision rows already stored.

The tables are created here; the backfill (replaying every stored decision row through the same fold the
service runs on each tick) is noted in `kv` and run by gpufinops.store.create_schema right after the schema
is complete, in the same transaction and schema lock, so it writes with the schema of the running code.
Raw rows are never pruned while it is pending: nothing stored is lost.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

from gpufinops.store.migrations import BACKFILL_KEY

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "verdict_episodes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("instance_id", sa.String(64), nullable=False),
        sa.Column("rule", sa.String(128), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("code", sa.String(32), nullable=False),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("last_seen_at", sa.DateTime, nullable=False, index=True),
        sa.Column("ticks", sa.Integer, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("stats", sa.Text),
        sa.Column("hourly_cost", sa.Float),
        sa.Column("team", sa.String(128)),
        sa.Column("instance_type", sa.String(64)),
        sa.Column("dry_run", sa.Boolean, nullable=False),
    )
    op.create_index("ix_verdict_episodes_head", "verdict_episodes", ["instance_id", "rule", "id"])
    op.create_table(
        "verdict_hours",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("hour", sa.DateTime, nullable=False),
        sa.Column("instance_id", sa.String(64), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("code", sa.String(32), nullable=False),
        sa.Column("measured", sa.Boolean, nullable=False),
        sa.Column("hourly_cost", sa.Float),
        sa.Column("team", sa.String(128)),
        sa.Column("instance_type", sa.String(64)),
        sa.Column("hours", sa.Float, nullable=False),
        sa.Column("ticks", sa.Integer, nullable=False),
        sa.Column("evaluations", sa.Integer, nullable=False),
        sa.Column("activity_hours", sa.Float, nullable=False),
        sa.Column("activity_max", sa.Float),
        sa.Column("memory_max_mib", sa.Float),
        sa.Column("after_stop_hours", sa.Float, nullable=False),
    )
    op.create_index("ix_verdict_hours_hour_instance", "verdict_hours", ["hour", "instance_id"])
    op.create_table(
        "verdict_tails",
        sa.Column("instance_id", sa.String(64), primary_key=True),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("code", sa.String(32), nullable=False),
        sa.Column("hourly_cost", sa.Float),
        sa.Column("team", sa.String(128)),
        sa.Column("instance_type", sa.String(64)),
        sa.Column("activity_mean", sa.Float),
        sa.Column("activity_max", sa.Float),
        sa.Column("memory_max_mib", sa.Float),
        sa.Column("evaluations", sa.Integer, nullable=False),
    )
    op.create_table(
        "service_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("last_seen_at", sa.DateTime, nullable=False, index=True),
        sa.Column("ticks", sa.Integer, nullable=False),
    )
    conn = op.get_bind()
    tables = sa.inspect(conn).get_table_names()
    if "kv" not in tables:  # a database from before kv existed (stamped at the baseline)
        op.create_table("kv", sa.Column("key", sa.String(128), primary_key=True),
                        sa.Column("value", sa.Text, nullable=False))
    if "decisions" in tables:
        has_rows = conn.execute(sa.text("SELECT 1 FROM decisions LIMIT 1")).first() is not None
        if has_rows:
            conn.execute(sa.text("DELETE FROM kv WHERE key = :k"), {"k": BACKFILL_KEY})
            conn.execute(sa.text("INSERT INTO kv (key, value) VALUES (:k, '1')"), {"k": BACKFILL_KEY})


def downgrade() -> None:
    for name in ("service_runs", "verdict_tails", "verdict_hours", "verdict_episodes"):
        op.drop_table(name)
