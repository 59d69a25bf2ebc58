"""How Kubernetes GPUs were allocated (device plugin or DRA, issue 37): k8s_node_hours.allocation (how the node
hands out its GPUs) and k8s_node_hours.dra_cents (of pods_cents, what DRA-allocated GPUs carried), and
instance_labels.allocation (a Kubernetes workload's), for the monthly report's node pool and workload tables.

Additive, in place: stored rows are kept. The node-hour rows written before read "device-plugin" and 0 DRA cents
(the server defaults): gpufinops counted only device-plugin GPUs then, so their pods' cents were all device-plugin
ones. instance_labels rows keep NULL until the workload's next tick (the report reads NULL as "device-plugin").

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # ALTER TABLE ... ADD COLUMN on SQLite and PostgreSQL alike, in place (no table copied): a NOT NULL column
    # takes its server default in every stored row.
    op.add_column("k8s_node_hours",
                  sa.Column("allocation", sa.String(32), nullable=False, server_default="device-plugin"))
    op.add_column("k8s_node_hours", sa.Column("dra_cents", sa.Integer, nullable=False, server_default="0"))
    # instance_labels.allocation may already be there: add_missing_columns adds a new nullable column on start,
    # so a database that ran this release's code before its migration (none should) must not fail here.
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("instance_labels")}
    if "allocation" not in have:
        op.add_column("instance_labels", sa.Column("allocation", sa.String(32)))


def downgrade() -> None:
    op.drop_column("instance_labels", "allocation")
    with op.batch_alter_table("k8s_node_hours") as batch:  # SQLite before 3.35 cannot drop a column in place
        batch.drop_column("dra_cents")
        batch.drop_column("allocation")
