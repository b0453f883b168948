"""Glossaries: a glossary, its dictionaries (one per language pair), their entries as rows.

Revision ID: 0001
Revises:
Create Date: 2025-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "glossaries",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("creation_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_glossaries"),
    )
    op.create_index("ix_glossaries_owner_creation_time", "glossaries", ["owner", "creation_time"])
    op.create_table(
        "glossary_dictionaries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("glossary_id", sa.String(36), nullable=False),
        sa.Column("source_lang", sa.String(35), nullable=False),
        sa.Column("target_lang", sa.String(35), nullable=False),
        sa.Column("entry_count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_glossary_dictionaries"),
        sa.ForeignKeyConstraint(
            ["glossary_id"],
            ["glossaries.id"],
            name="fk_glossary_dictionaries_glossary_id_glossaries",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint(
            "glossary_id",
            "source_lang",
            "target_lang",
            name="uq_glossary_dictionaries_glossary_id_source_lang_target_lang",
        ),
    )
    op.create_table(
        "glossary_entries",
        sa.Column("dictionary_id", sa.Integer(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("dictionary_id", "ordinal", name="pk_glossary_entries"),
        sa.ForeignKeyConstraint(
            ["dictionary_id"],
            ["glossary_dictionaries.id"],
            name="fk_glossary_entries_dictionary_id_glossary_dictionaries",
            ondelete="CASCADE",
        ),
    )


def downgrade() -> None:
    op.drop_table("glossary_entries")
    op.drop_table("glossary_dictionaries")
    op.drop_index("ix_glossaries_owner_creation_time", table_name="glossaries")
    op.drop_table("glossaries")
