"""The database under the store: which one the settings name, its schema's migrations (from
nothing, twice, by several processes at once, refused when unknown), the SQLite connection
settings, `nmt db`, and a URL's password kept out of every log line and message."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from pydantic import SecretStr
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url

from service.serving.settings import Settings
from service.store import Database, StoreError, StoreUnavailable, database_url, open_store, shown
from service.store.database import current_revision, head_revision, migrate
from service.store.schema import metadata
from tests.conftest import ROOT
from tests.store.conftest import settings_for

TABLES = {
    "alembic_version",
    "glossaries",
    "glossary_dictionaries",
    "glossary_entries",
    "document_jobs",
    "document_files",
    "document_chunks",
}


# --- which database -----------------------------------------------------------------------


def test_the_default_is_sqlite_under_the_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("NMT_DATABASE_URL", raising=False)
    monkeypatch.delenv("NMT_STATE_DIR", raising=False)
    assert str(database_url(Settings())) == "sqlite:///data/nmt.db"  # relative: the working dir
    monkeypatch.setenv("NMT_STATE_DIR", str(tmp_path / "state"))
    url = database_url(Settings())
    assert (url.drivername, url.database) == ("sqlite", str(tmp_path / "state" / "nmt.db"))
    # The folder is made at start, the file and schema with it.
    store = open_store(Settings())
    store.close()
    assert (tmp_path / "state" / "nmt.db").is_file()


@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "postgresql+psycopg"])
def test_postgresql_urls_mean_psycopg(scheme: str) -> None:
    url = database_url(settings_for(f"{scheme}://u:p@db.example:5433/nmt"))
    assert url.drivername == "postgresql+psycopg"
    assert (url.host, url.port, url.database) == ("db.example", 5433, "nmt")


def test_other_databases_and_non_urls_are_refused_without_echoing_them() -> None:
    with pytest.raises(StoreError, match="'mysql' is not supported"):
        database_url(settings_for("mysql://u:sekrit@h/db"))
    with pytest.raises(StoreError, match="not a database URL") as refused:
        database_url(settings_for("sekrit-password-in-a-typo"))
    assert "sekrit" not in str(refused.value)


def test_the_password_is_masked_and_kept_out_of_settings_reprs() -> None:
    settings = settings_for("postgresql://nmt:sekrit@db:5432/nmt")
    assert shown(database_url(settings)) == "postgresql+psycopg://nmt:***@db:5432/nmt"
    assert "sekrit" not in repr(settings) and "sekrit" not in str(settings.model_dump())


def test_a_database_that_does_not_answer_is_unavailable_without_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StoreUnavailable, match="database is unavailable") as refused:
        open_store(settings_for("postgresql+psycopg://nmt:sekrit@127.0.0.1:1/nmt"))
    assert "sekrit" not in str(refused.value)
    assert "sekrit" not in caplog.text


def test_no_log_line_holds_the_password(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A real server that asks for the password: every record, message and fields, of the
    store and the libraries under it, from opening (migrations included) to closing."""
    caplog.set_level(logging.DEBUG)
    store = open_store(settings_for(postgres_url))
    store.glossaries.count()
    store.close()
    password = database_url(settings_for(postgres_url)).password
    assert password and len(caplog.records) > 1
    for record in caplog.records:
        assert password not in record.getMessage()
        assert password not in json.dumps(vars(record), default=str)
    opened = [r for r in caplog.records if r.getMessage() == "database open"]
    assert opened and opened[0].database.endswith(":***@" + postgres_url.split("@", 1)[1])


# --- migrations ------------------------------------------------------------------------------


def test_migrations_run_from_nothing_to_head_and_again_do_nothing(database_url: str) -> None:
    database = Database(database_url_of(database_url))
    try:
        assert current_revision(database) is None
        assert not set(inspect(database.engine).get_table_names()) & TABLES
        assert migrate(database) == head_revision()
        assert set(inspect(database.engine).get_table_names()) >= TABLES
        assert migrate(database) == head_revision()  # a second time: nothing to do
    finally:
        database.close()


def test_the_migrations_make_the_schema_the_code_reads(database_url: str) -> None:
    """What Alembic's autogenerate would find between the migrated database and schema.py:
    nothing (a migration written by hand and the tables the code uses agree)."""
    database = Database(database_url_of(database_url))
    try:
        migrate(database)
        with database.engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            differences = compare_metadata(context, metadata)
        assert differences == []
    finally:
        database.close()


def open_together(url: str, count: int = 4) -> list[BaseException]:
    """Open `count` stores on `url` from as many threads at once, close them; what failed."""
    together = threading.Barrier(count)
    failures: list[BaseException] = []
    stores = []

    def start() -> None:
        together.wait()
        try:
            stores.append(open_store(settings_for(url)))
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=start) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store in stores:
        store.close()
    return failures


def test_replicas_starting_together_migrate_one_after_the_other(database_url: str) -> None:
    """Four stores opened at once on an empty database: one migrates, the others wait for it
    (SQLite's write lock, PostgreSQL's advisory lock) and find the schema at head."""
    assert open_together(database_url) == []
    database = Database(make_url(database_url))
    try:
        assert current_revision(database) == head_revision()
    finally:
        database.close()


def test_servers_opening_a_new_sqlite_file_together_all_open_it(tmp_path: Path) -> None:
    """The first connections to a new SQLite file switch it to WAL together: SQLite answers the
    ones that meet a lock "database is locked" at once, busy timeout or not. Each must wait its
    turn instead. The race is lost in a few percent of starts, so it is run many times."""
    for attempt in range(60):
        failures = open_together(f"sqlite:///{tmp_path / f'nmt-{attempt}.db'}")
        assert failures == [], (attempt, failures)


def test_without_migrating_an_old_schema_is_refused(database_url: str) -> None:
    with pytest.raises(StoreError, match="nmt db upgrade"):
        open_store(settings_for(database_url, database_migrate=False))
    open_store(settings_for(database_url)).close()  # migrates
    open_store(settings_for(database_url, database_migrate=False)).close()  # now at head


def test_a_schema_newer_than_the_code_is_refused(database_url: str) -> None:
    store = open_store(settings_for(database_url))
    with store.database.write() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    store.close()
    with pytest.raises(StoreError, match=r"'9999'.*does not know"):
        open_store(settings_for(database_url))
    with pytest.raises(StoreError, match="'9999'"):
        open_store(settings_for(database_url, database_migrate=False))


def test_sqlite_runs_in_wal_mode_with_foreign_keys_and_a_busy_timeout(tmp_path: Path) -> None:
    store = open_store(settings_for(f"sqlite:///{tmp_path / 'nmt.db'}"))
    try:
        with store.database.read() as connection:
            pragma = lambda name: connection.exec_driver_sql(f"PRAGMA {name}").scalar()  # noqa: E731
            assert pragma("journal_mode") == "wal"
            assert pragma("foreign_keys") == 1
            assert pragma("busy_timeout") >= 10_000
    finally:
        store.close()


# --- `nmt db` --------------------------------------------------------------------------------


def nmt_db(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nmt_cli", "db", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_nmt_db_upgrade_and_current(database_url: str) -> None:
    env = {"NMT_DATABASE_URL": database_url}
    before = nmt_db("current", env=env)
    assert before.returncode == 3, before.stderr  # not at head
    assert json.loads(before.stdout)["revision"] is None
    upgraded = nmt_db("upgrade", env=env)
    assert upgraded.returncode == 0, upgraded.stderr
    answer = json.loads(upgraded.stdout)
    assert answer["revision"] == answer["head"] == head_revision()
    assert nmt_db("current", env=env).returncode == 0
    password = database_url_of(database_url).password
    if password:
        assert password not in upgraded.stdout + upgraded.stderr
        assert ":***@" in answer["database"]


def test_nmt_db_says_what_is_wrong_without_the_password() -> None:
    env = {"NMT_DATABASE_URL": "postgresql://nmt:sekrit@127.0.0.1:1/nmt"}
    failed = nmt_db("upgrade", env=env)
    assert failed.returncode == 1
    assert "database is unavailable" in failed.stderr and "nmt:***@127.0.0.1:1" in failed.stderr
    assert "sekrit" not in failed.stdout + failed.stderr


def database_url_of(url: str):
    return database_url(Settings(database_url=SecretStr(url)))
