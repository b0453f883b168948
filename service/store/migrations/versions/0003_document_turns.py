"""Document jobs take turns: a job a worker gives up for others goes to the back of the queue.

`queued_since` orders the queue (the oldest first): set when the job is uploaded, and again
when a worker hands it back after its turn (NMT_DOCUMENT_TURN_SECONDS). Existing jobs keep
their place: their upload time.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("document_jobs") as table:
        table.add_column(sa.Column("queued_since", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE document_jobs SET queued_since = created")
    # (A table rebuilt on SQLite, which cannot alter a column in place: batch mode's way.)
    with op.batch_alter_table("document_jobs") as table:
        table.alter_column("queued_since", existing_type=sa.DateTime(timezone=True), nullable=False)
    op.create_index(
        "ix_document_jobs_status_queued_since", "document_jobs", ["status", "queued_since"]
    )


def downgrade() -> None:
    op.drop_index("ix_document_jobs_status_queued_since", table_name="document_jobs")
    with op.batch_alter_table("document_jobs") as table:
        table.drop_column("queued_since")
