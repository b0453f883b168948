"""The database: which one (NMT_DATABASE_URL, else SQLite under NMT_STATE_DIR), its connections
and transactions, and its schema's migrations.

SQLite is the default: one file, nothing to run beside the server, right for one server.
Several replicas share a PostgreSQL database (`postgresql+psycopg://`), so that every one sees
the same state; nothing of it is kept in the process.

Transactions: every read runs in one (a consistent view over its several queries: SQLite's
snapshot, PostgreSQL's REPEATABLE READ), every write too, all or nothing. SQLite writes begin
IMMEDIATE, taking the write lock first (waiting up to the busy timeout for another writer),
rather than failing at once half-way when two writers meet; PostgreSQL writers lock the
glossary row they change (glossaries.py).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.pool import StaticPool

from service.serving.settings import Settings
from service.store.documents import DocumentStore
from service.store.errors import StoreError, StoreUnavailable
from service.store.glossaries import GlossaryStore
from service.store.threads import StoreThreads, may_commit

log = logging.getLogger("nmt.store")

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SQLITE_FILE = "nmt.db"
# How long a SQLite writer waits for another one to finish before it gives up.
SQLITE_BUSY_TIMEOUT_MS = 30_000
# How long a PostgreSQL connection attempt may take (unless the URL says `connect_timeout`).
POSTGRES_CONNECT_TIMEOUT_S = 10
# pg_advisory_xact_lock's key while migrating: one replica migrates, the others wait for it.
MIGRATION_LOCK = 0x6E6D742D6462  # "nmt-db"


def database_url(settings: Settings) -> URL:
    """NMT_DATABASE_URL, or the SQLite file under NMT_STATE_DIR. `postgresql://` and
    `postgres://` (as providers print them) mean psycopg 3, the driver installed."""
    given = settings.database_url.get_secret_value().strip()
    if not given:
        return URL.create("sqlite", database=str(settings.state_dir / SQLITE_FILE))
    try:
        url = make_url(given)
    except ArgumentError:
        # SQLAlchemy's message repeats the URL, password and all.
        raise StoreError("NMT_DATABASE_URL is not a database URL (dialect://...)") from None
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        raise StoreError(
            f"NMT_DATABASE_URL: {url.get_backend_name()!r} is not supported; "
            "use sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST/DATABASE"
        )
    return url


def shown(url: URL) -> str:
    """The URL as logs and messages may show it: the password masked."""
    return url.render_as_string(hide_password=True)


class Database:
    """An engine, and the two kinds of transaction the store runs on it."""

    def __init__(self, url: URL) -> None:
        self.url = url
        self.shown_url = shown(url)
        self.dialect = url.get_backend_name()
        self.engine = _sqlite_engine(url) if self.dialect == "sqlite" else _postgres_engine(url)
        if self.dialect == "postgresql":
            self._reader = self.engine.execution_options(isolation_level="REPEATABLE READ")
        else:
            self._reader = self.engine
        self._writer = self.engine.execution_options(nmt_write=True)

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with _available(), self._reader.begin() as connection:
            yield connection

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """One transaction, committed when the block ends, rolled back if it raises, or if
        the request it runs for has been answered meanwhile (threads.py)."""
        with _available(), self._writer.begin() as connection:
            yield connection
            if not may_commit():
                raise StoreUnavailable("rolled back: the request waited too long for it")

    def close(self) -> None:
        self.engine.dispose()


@contextmanager
def _available() -> Iterator[None]:
    try:
        yield
    except OperationalError as error:
        # The driver's own words (no SQL, no parameters: they may hold glossary entries).
        reason = str(error.orig).strip().splitlines()[0] if error.orig else type(error).__name__
        raise StoreUnavailable(f"the database is unavailable: {reason}") from error


def _sqlite_engine(url: URL) -> Engine:
    database = url.database or ""
    in_memory = database in ("", ":memory:") or database.startswith("file::memory:")
    if in_memory:
        # One connection for everyone: each new one would be another, empty, database.
        engine = create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url)

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # The driver's own transaction handling off (it would not begin one before DDL, and
        # never IMMEDIATE): the "begin" listener below begins every transaction itself.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        if not in_memory:
            # Readers do not block the writer nor it them; the file stays consistent when the
            # process is killed mid-transaction.
            _use_write_ahead_log(cursor)
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        writing = connection.get_execution_options().get("nmt_write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if writing else "BEGIN")

    return engine


def _use_write_ahead_log(cursor: sqlite3.Cursor) -> None:
    """PRAGMA journal_mode=WAL, waiting (up to the busy timeout) for other connections.

    Switching a new database to WAL fails with "database is locked" at once, without calling
    the busy handler, while another connection holds a lock on it: replicas (or threads)
    opening a fresh database together meet here. So this waits and tries again."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _postgres_engine(url: URL) -> Engine:
    connect_args = {}
    if "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = POSTGRES_CONNECT_TIMEOUT_S
    # pre_ping: a connection the server closed (a restart, a failover) is replaced, not used.
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args)


# --- migrations ------------------------------------------------------------------------------


def _alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    # Config is a ConfigParser: a "%" in the path would read as interpolation.
    config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The revision this code's schema is at (the newest migration)."""
    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None, "no migrations found"
    return head


def _migration_context(connection: Connection) -> MigrationContext:
    # Transactional DDL on both databases (SQLite's too: database.py begins its transactions).
    return MigrationContext.configure(connection, opts={"transactional_ddl": True})


def current_revision(database: Database) -> str | None:
    """The revision the database's schema is at; None for an empty database."""
    with database.read() as connection:
        return _migration_context(connection).get_current_revision()


def migrate(database: Database) -> str:
    """Bring the schema to this code's head, in one transaction (a migration cut short leaves
    the schema as it was), one process at a time. Returns the revision reached."""
    with database.write() as connection:
        if database.dialect == "postgresql":
            # Held until the transaction ends: a second replica waits here, then finds the
            # schema at head and has nothing to do.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        context = _migration_context(connection)
        before = context.get_current_revision()
        try:
            command.upgrade(_alembic_config(connection), "head")
        except CommandError as error:
            # A revision this code does not know: a newer server has migrated the database.
            raise StoreError(
                f"the database's schema is at revision {before!r}, which this version of "
                f"nmt-serve does not know (its newest is {head_revision()!r}): a newer "
                f"version has migrated it ({error})"
            ) from error
        after = context.get_current_revision()
    if after != before:
        log.info(
            "database schema migrated",
            extra={"database": database.shown_url, "from": before, "to": after},
        )
    return str(after)


def check_schema(database: Database) -> str:
    """Refuse a schema other than this code's (when start-up does not migrate)."""
    current, head = current_revision(database), head_revision()
    if current != head:
        raise StoreError(
            f"the database's schema is at revision {current!r}, this server needs {head!r}: "
            "run `nmt db upgrade` (or start with NMT_DATABASE_MIGRATE=true)"
        )
    return head


# --- the store -------------------------------------------------------------------------------


class Store:
    """What the server keeps: glossaries and document jobs. Synchronous: the event loop calls
    it on its threads (`threads.run`), never itself."""

    def __init__(self, database: Database, threads: StoreThreads) -> None:
        self.database = database
        self.threads = threads
        self.glossaries = GlossaryStore(database, threads)
        self.documents = DocumentStore(database)

    def close(self) -> None:
        self.threads.close()
        self.database.close()


def open_store(settings: Settings, migrate_schema: bool | None = None) -> Store:
    """The store of NMT_DATABASE_URL, its schema migrated to head when NMT_DATABASE_MIGRATE
    (or `migrate_schema`) says so, else checked to be at head."""
    database = Database(database_url(settings))
    try:
        if settings.database_migrate if migrate_schema is None else migrate_schema:
            revision = migrate(database)
        else:
            revision = check_schema(database)
    except BaseException:
        database.close()
        raise
    log.info("database open", extra={"database": database.shown_url, "revision": revision})
    return Store(database, StoreThreads(settings.database_timeout_seconds))
