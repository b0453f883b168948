"""Glossaries are the server's durable state: one outlives a restart of the server, and two
servers on one PostgreSQL (a real server, started here) see each other's, as replicas behind
one load balancer do. (A create cut off half way: tests/store/test_crash.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import deepl
import pytest

from tests.postgres import PostgresServer, running_postgres, why_not
from tests.servers import Server, running_server

TEXT = "Un chien court dans l'herbe verte."


def client(server: Server) -> deepl.DeepLClient:
    return deepl.DeepLClient("any-key", server_url=server.url, send_platform_info=False)


def serve(bundle: Path, folder: Path, url: str):
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    return running_server(bundle, folder / "logs", threads=1, database_url=url)


def test_a_glossary_survives_a_restart(fr_en_bundle: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with serve(fr_en_bundle, tmp_path / "first", url) as first:
        made = client(first).create_glossary("dogs", "FR", "EN", {"chien": "hound"})
    with serve(fr_en_bundle, tmp_path / "second", url) as second:
        again = client(second)
        assert [g.glossary_id for g in again.list_glossaries()] == [made.glossary_id]
        assert again.get_glossary_entries(made) == {"chien": "hound"}
        found = again.translate_text(TEXT, source_lang="FR", target_lang="EN-GB", glossary=made)
        assert "hound" in found.text.lower()


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    with running_postgres() as server:
        yield server


def test_two_servers_on_one_postgresql_see_each_others_glossaries(
    fr_en_bundle: Path, tmp_path: Path, postgres: PostgresServer
) -> None:
    url = postgres.create_database()
    with (
        serve(fr_en_bundle, tmp_path / "a", url) as a,
        serve(fr_en_bundle, tmp_path / "b", url) as b,
    ):
        made = client(a).create_glossary("dogs", "FR", "EN", {"chien": "hound"})
        assert [g.glossary_id for g in client(b).list_glossaries()] == [made.glossary_id]
        found = client(b).translate_text(TEXT, source_lang="FR", target_lang="EN-GB", glossary=made)
        assert "hound" in found.text.lower()
        client(b).delete_glossary(made)
        assert client(a).list_glossaries() == []
