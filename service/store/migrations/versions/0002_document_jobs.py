"""Document jobs: the job, its files, its translated chunks.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "document_jobs",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("filename", sa.Text(), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("source_lang", sa.String(35), nullable=False),
        sa.Column("target_lang", sa.String(35), nullable=False),
        sa.Column("glossary_id", sa.String(36), nullable=True),
        sa.Column("options", sa.Text(), nullable=False),
        sa.Column("segments", sa.Integer(), nullable=False),
        sa.Column("segments_done", sa.Integer(), nullable=False),
        sa.Column("characters", sa.Integer(), nullable=False),
        sa.Column("seconds_remaining", sa.Integer(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("worker", sa.String(64), nullable=True),
        sa.Column("lease_expires", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_document_jobs"),
    )
    op.create_index("ix_document_jobs_status_created", "document_jobs", ["status", "created"])
    op.create_index("ix_document_jobs_expires", "document_jobs", ["expires"])
    op.create_table(
        "document_files",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["document_jobs.id"],
            name="fk_document_files_job_id_document_jobs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "kind", name="pk_document_files"),
    )
    op.create_table(
        "document_chunks",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("first_segment", sa.Integer(), nullable=False),
        sa.Column("translations", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["document_jobs.id"],
            name="fk_document_chunks_job_id_document_jobs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "first_segment", name="pk_document_chunks"),
    )


def downgrade() -> None:
    op.drop_table("document_chunks")
    op.drop_table("document_files")
    op.drop_index("ix_document_jobs_expires", table_name="document_jobs")
    op.drop_index("ix_document_jobs_status_created", table_name="document_jobs")
    op.drop_table("document_jobs")
