"""k8s_node_hours: per hour and Kubernetes GPU node, its cost split into its pods' shares and its idle capacity,
its GPU-hours and the time no pod held any of its GPUs (the monthly report's node pool table).

Additive: a new table, no stored row touched. It fills from the next tick that reads the cluster
(gpufinops.store.Store.record_node_hours); months before it show no node pool table.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "k8s_node_hours",
        sa.Column("hour", sa.DateTime, primary_key=True),
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("instance_id", sa.String(64), nullable=False),
        sa.Column("node_pool", sa.String(128), nullable=False),
        sa.Column("sharing", sa.String(16), nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("hours", sa.Float, nullable=False),
        sa.Column("gpu_hours", sa.Float, nullable=False),
        sa.Column("node_cents", sa.Integer, nullable=False),
        sa.Column("pods_cents", sa.Integer, nullable=False),
        sa.Column("idle_cents", sa.Integer, nullable=False),
        sa.Column("unpriced_hours", sa.Float, nullable=False),
        sa.Column("ticks", sa.Integer, nullable=False),
        sa.Column("empty_ticks", sa.Integer, nullable=False),
        sa.Column("empty_hours", sa.Float, nullable=False),
        sa.Column("last_seen", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("k8s_node_hours")
