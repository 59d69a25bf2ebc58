"""instance_labels: what the service saw of each instance in its inventory (owner, team, account, region,
type, GPUs, how its price was found, first and last seen), for the report's owner / account / region columns and
its marks on estimated prices.

Additive: a new table, no stored row touched. It fills from the next evaluation tick on
(gpufinops.store.Store.record_instances); months evaluated before it keep showing billing's owner, account
and region, or "no owner tag".

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "instance_labels",
        sa.Column("instance_id", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(128)),
        sa.Column("team", sa.String(128)),
        sa.Column("account", sa.String(64)),
        sa.Column("region", sa.String(64)),
        sa.Column("instance_type", sa.String(64)),
        sa.Column("gpu_model", sa.String(64)),
        sa.Column("gpu_count", sa.Integer),
        sa.Column("provider", sa.String(32)),
        sa.Column("price_source", sa.String(160)),
        sa.Column("first_seen", sa.DateTime, nullable=False),
        sa.Column("last_seen", sa.DateTime, nullable=False, index=True),
    )


def downgrade() -> None:
    op.drop_table("instance_labels")
