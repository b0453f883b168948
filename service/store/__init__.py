"""Durable state: what users create and the server must keep (glossaries, document jobs).

SQLAlchemy over SQLite (the default, a file under NMT_STATE_DIR) or PostgreSQL (NMT_DATABASE_URL,
for several replicas); the schema is Alembic's, migrated at start-up or by `nmt db upgrade`.
Synchronous, and knows nothing of HTTP: the routes call it from worker threads.

A new schema revision is a new module in migrations/versions/ whose `down_revision` is the
newest one before it, and the matching change to schema.py.
"""

from service.store.database import (
    Database,
    Store,
    StoreError,
    StoreUnavailable,
    database_url,
    open_store,
    shown,
)
from service.store.documents import (
    ClaimedDocument,
    DocumentNotFound,
    DocumentNotReady,
    DocumentStatus,
    DocumentStore,
    NewDocument,
)
from service.store.glossaries import (
    Dictionary,
    DictionaryInfo,
    DictionaryNotFound,
    GlossaryInfo,
    GlossaryNotFound,
    GlossaryStore,
    InvalidDictionary,
    InvalidGlossary,
)

__all__ = [
    "ClaimedDocument",
    "Database",
    "Dictionary",
    "DictionaryInfo",
    "DictionaryNotFound",
    "DocumentNotFound",
    "DocumentNotReady",
    "DocumentStatus",
    "DocumentStore",
    "GlossaryInfo",
    "GlossaryNotFound",
    "GlossaryStore",
    "InvalidDictionary",
    "InvalidGlossary",
    "NewDocument",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "database_url",
    "open_store",
    "shown",
]
