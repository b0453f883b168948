"""A server killed (SIGKILL, no clean-up of any kind) in the middle of creating a glossary
leaves the database with all of that glossary or none of it, and usable: on SQLite (the WAL
journal) and on PostgreSQL (the transaction dies with its connection)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from service.store import Dictionary, open_store
from service.store.schema import glossary_entries
from tests.conftest import ROOT
from tests.store.conftest import settings_for

ENTRIES = 1_000_000

# The child: a store on the database, then one big create; it says when it starts and ends.
CHILD = """
import sys
from pydantic import SecretStr
from service.serving.settings import Settings
from service.store import Dictionary, open_store

url, count = sys.argv[1], int(sys.argv[2])
store = open_store(Settings(database_url=SecretStr(url)))
entries = tuple((f"term {i}", f"target {i}") for i in range(count))
print("creating", flush=True)
info = store.glossaries.create("crash", "big", [Dictionary("en", "de", entries)])
print("created", info.glossary_id, flush=True)
"""


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.01)


def rows_being_written(url: str) -> Callable[[], bool]:
    """A check that the child's create is under way and not done, seen from outside it."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        # Uncommitted pages spill into the WAL long before the commit (the page cache is small).
        wal = Path(f"{parsed.database}-wal")
        return lambda: wal.exists() and wal.stat().st_size > 8_000_000
    engine = create_engine(url, poolclass=NullPool)
    copying = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE state = 'active' AND query LIKE 'COPY%' AND pid <> pg_backend_pid()"
    )

    def check() -> bool:
        with engine.connect() as connection:
            return bool(connection.execute(copying).scalar())

    return check


def test_a_create_killed_half_way_leaves_all_or_nothing(database_url: str) -> None:
    open_store(settings_for(database_url)).close()  # migrated before the child starts
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, database_url, str(ENTRIES)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "creating", child.stderr.read()
        wait_for(rows_being_written(database_url), 60, "the child's rows")
        time.sleep(0.2)  # well inside the insert: a million rows take seconds
    finally:
        child.kill()  # SIGKILL
    out, _ = child.communicate(timeout=60)
    assert "created" not in out, "the create finished before the kill: the test proved nothing"

    store = open_store(settings_for(database_url))
    try:
        found = store.glossaries.list("crash")
        with store.database.read() as connection:
            entry_rows = connection.execute(
                select(func.count()).select_from(glossary_entries)
            ).scalar_one()
            if store.database.dialect == "sqlite":
                assert connection.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
        if found:  # committed just before the kill: then all of it
            (info,) = found
            assert info.entry_count == entry_rows == ENTRIES
        else:
            assert entry_rows == 0  # no orphan rows of the glossary that never was
        # Usable: a write and a read after the crash.
        small = store.glossaries.create("crash", "after", [Dictionary("en", "de", (("a", "b"),))])
        assert store.glossaries.dictionary("crash", small.glossary_id, "en", "de").entries == (
            ("a", "b"),
        )
    finally:
        store.close()
