"""Baseline: the store's schema before Alembic (decisions, instance_state, marks, actions, notifications,
kv, leases), as release 0.1.0 created it with `create_all`.

A database written before Alembic is stamped at this revision instead of running it.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "decisions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), nullable=False, index=True),
        sa.Column("instance_id", sa.String(64), nullable=False, index=True),
        sa.Column("rule", sa.String(128), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("code", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("evaluated_at", sa.DateTime, nullable=False, index=True),
        sa.Column("window_s", sa.Integer),
        sa.Column("activity_mean", sa.Float),
        sa.Column("activity_max", sa.Float),
        sa.Column("memory_max_mib", sa.Float),
        sa.Column("coverage", sa.Float),
        sa.Column("hourly_cost", sa.Float),
        sa.Column("team", sa.String(128)),
        sa.Column("instance_type", sa.String(64)),
        sa.Column("dry_run", sa.Boolean, nullable=False),
    )
    op.create_table(
        "instance_state",
        sa.Column("instance_id", sa.String(64), primary_key=True),
        sa.Column("rule", sa.String(128), primary_key=True),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("since", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.Column("stopped_at", sa.DateTime),
        sa.Column("stop_dry_run", sa.Boolean),
    )
    op.create_table(
        "marks",
        sa.Column("instance_id", sa.String(64), primary_key=True),
        sa.Column("rule", sa.String(128), nullable=False),
        sa.Column("marked_at", sa.DateTime, nullable=False),
        sa.Column("stop_at", sa.DateTime, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("dry_run", sa.Boolean, nullable=False),
        sa.Column("warned_at", sa.DateTime),
    )
    op.create_table(
        "actions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("instance_id", sa.String(64), nullable=False, index=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("rule", sa.String(128)),
        sa.Column("dry_run", sa.Boolean, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("at", sa.DateTime, nullable=False, index=True),
        sa.Column("finished_at", sa.DateTime),
    )
    op.create_table(
        "notifications",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("channel", sa.String(128), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("detail", sa.Text),
        sa.Column("attempts", sa.Integer),
        sa.Column("next_attempt_at", sa.DateTime),
        sa.Column("blocks", sa.Text),
    )
    op.create_table(
        "kv",
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("token", sa.Integer, nullable=False),
        sa.Column("acquired_at", sa.DateTime, nullable=False),
        sa.Column("renewed_at", sa.DateTime, nullable=False),
        sa.Column("expires_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    for name in ("leases", "kv", "notifications", "actions", "marks", "instance_state", "decisions"):
        op.drop_table(name)
