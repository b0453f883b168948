"""The tables of the store, in SQLAlchemy Core: what the code reads and writes (the migrations
under migrations/versions/ create them, each frozen as it was written).

A glossary has dictionaries (one per language pair), a dictionary has entries. Entries are rows,
numbered in the order they were given (`ordinal`, 0, 1, ...): a dictionary may hold a million of
them, which a JSON column would rewrite whole at every change and read whole at every lookup.
Deleting a glossary or a dictionary deletes what it holds (ON DELETE CASCADE; SQLite needs
`PRAGMA foreign_keys=ON`, which database.py sets on every connection).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

# Constraint names spelled out, so that a later migration can name what it alters on every
# database (SQLite and PostgreSQL would otherwise name them differently, or not at all).
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime in, the same out, on every database: SQLite keeps no zone
    (it stores the UTC wall time), PostgreSQL's timestamptz answers in the session's zone."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("a naive datetime: give it a timezone (UTC)")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# Lengths: a UUID; an owner id (a key's hash, hex); a language code (BCP 47 tags fit in 35).
glossaries = Table(
    "glossaries",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("owner", String(128), nullable=False),
    Column("name", Text, nullable=False),
    Column("creation_time", UtcDateTime, nullable=False),
    # 1 at creation, one more at every change to the glossary or its dictionaries, in the
    # same transaction: a cache of what it held is current, on any replica, while this is.
    Column("version", Integer, nullable=False),
    Index(None, "owner", "creation_time"),
)

glossary_dictionaries = Table(
    "glossary_dictionaries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column(
        "glossary_id",
        String(36),
        ForeignKey("glossaries.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("source_lang", String(35), nullable=False),
    Column("target_lang", String(35), nullable=False),
    # Kept with the entries in the same transactions: listing glossaries counts no rows.
    Column("entry_count", Integer, nullable=False),
    UniqueConstraint("glossary_id", "source_lang", "target_lang"),
)

glossary_entries = Table(
    "glossary_entries",
    metadata,
    Column(
        "dictionary_id",
        Integer,
        ForeignKey("glossary_dictionaries.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("ordinal", Integer, primary_key=True),
    Column("source", Text, nullable=False),
    Column("target", Text, nullable=False),
)


# Document jobs (DeepL's /v2/document, LibreTranslate's /translate_file). The job row is what
# status polls read; the files are rows of their own (read only by the worker and the download),
# and the translated segments are kept a chunk at a time, so that a worker that takes over a
# job whose worker died starts after the last chunk written.
document_jobs = Table(
    "document_jobs",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("key_hash", String(64), nullable=False),  # sha256 of the document key, never the key
    Column("owner", String(128), nullable=False),
    Column("status", String(16), nullable=False),  # queued, translating, done, downloaded, error
    Column("filename", Text, nullable=False),  # of the translated file, as it is offered
    Column("format", String(16), nullable=False),
    Column("source_lang", String(35), nullable=False),
    Column("target_lang", String(35), nullable=False),
    Column("glossary_id", String(36), nullable=True),
    Column("options", Text, nullable=False),  # JSON: the search options the upload asked for
    Column("segments", Integer, nullable=False),
    Column("segments_done", Integer, nullable=False),
    Column("characters", Integer, nullable=False),
    Column("seconds_remaining", Integer, nullable=True),
    Column("error_message", Text, nullable=True),
    Column("worker", String(64), nullable=True),  # who holds the lease
    Column("lease_expires", UtcDateTime, nullable=True),
    Column("attempts", Integer, nullable=False),  # claims so far: a file that kills workers stops
    Column("created", UtcDateTime, nullable=False),
    Column("finished", UtcDateTime, nullable=True),
    Column("expires", UtcDateTime, nullable=False),
    # The queue's order: the upload, or the last time a worker gave the job up for its turn.
    Column("queued_since", UtcDateTime, nullable=False),
    Index(None, "status", "created"),
    Index(None, "expires"),
    Index(None, "status", "queued_since"),
)

document_files = Table(
    "document_files",
    metadata,
    Column(
        "job_id", String(32), ForeignKey("document_jobs.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("kind", String(8), primary_key=True),  # "input" or "output"
    Column("data", LargeBinary, nullable=False),
)

document_chunks = Table(
    "document_chunks",
    metadata,
    Column(
        "job_id", String(32), ForeignKey("document_jobs.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("first_segment", Integer, primary_key=True),
    Column("translations", Text, nullable=False),  # JSON list of translated segments
)
