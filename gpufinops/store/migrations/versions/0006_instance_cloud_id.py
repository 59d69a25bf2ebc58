"""The provider's own id of an instance where its subject id does not carry it (issue 39): instance_labels.cloud_id, a
GCE VM's numeric id, by which Google's bill may name the VM (`//compute.googleapis.com/.../instances/<id>`), so that
`costs --idle` turns such a bill's `gce-unlisted:` id into the listed VM's.

Additive, in place: stored rows are kept, their cloud_id NULL until the instance's next tick.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # add_missing_columns adds a new nullable column on start: a database that ran this release's code before its
    # migration must not fail here.
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("instance_labels")}
    if "cloud_id" not in have:
        op.add_column("instance_labels", sa.Column("cloud_id", sa.String(64)))


def downgrade() -> None:
    with op.batch_alter_table("instance_labels") as batch:  # SQLite before 3.35 cannot drop a column in place
        batch.drop_column("cloud_id")
