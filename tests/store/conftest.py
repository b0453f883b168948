"""Fixtures of the store's tests, usable by other suites too (import them into a conftest.py):

- `postgres_server`: a real PostgreSQL server for the session (tests/postgres.py), or a skip
  saying why there is none;
- `postgres_url`: a new empty database on it for one test (NMT_DATABASE_URL);
- `database_url`: the URL of an empty database for one test, once per backend: SQLite (a file
  in tmp_path) and PostgreSQL (skipped where it is not installed);
- `store`: a store opened on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from service.serving.settings import Settings
from service.store import Store, open_store
from tests.postgres import PostgresServer, running_postgres, why_not

# PostgreSQL's tests are not slow-marked: its server starts in about a second, once a session,
# and each test gets a new database in a tenth of one.
BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    with running_postgres() as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    url = postgres_server.create_database()
    yield url
    postgres_server.drop_database(make_url(url).database or "")


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'nmt.db'}"
    return request.getfixturevalue("postgres_url")


def settings_for(url: str, **values: object) -> Settings:
    """Settings of a server on the database at `url` (whatever NMT_* the shell has)."""
    return Settings(database_url=SecretStr(url), **values)


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    """A store on an empty database (migrated from nothing), once per backend."""
    opened = open_store(settings_for(database_url))
    yield opened
    opened.close()
