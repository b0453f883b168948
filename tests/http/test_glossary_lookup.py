"""A stored glossary's terms for translations (service/http/glossary_lookup.py), on a real
SQLite store whose statements are counted: each version of a dictionary is read and indexed
once, however many requests ask for it and at once; a change (a new version) is seen by the
next request; a deleted glossary is not found, cached or not; the cache keeps to its size."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import event

from service.http.glossary_lookup import TerminologyCache, terminology_of
from service.store import Dictionary, Store, open_store
from tests.store.conftest import settings_for


class NotFound(Exception):
    pass


def error(status: int, message: str) -> Exception:
    return NotFound(status, message)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(settings_for(f"sqlite:///{tmp_path / 'nmt.db'}"))
    yield opened
    opened.close()


@pytest.fixture
def entry_reads(store: Store) -> list[str]:
    """Every statement that reads glossary entries, as it runs."""
    reads: list[str] = []

    @event.listens_for(store.database.engine, "before_cursor_execute")
    def _count(_conn, _cursor, statement: str, *_args) -> None:
        if "FROM glossary_entries" in statement:
            reads.append(statement)

    return reads


def lookup(store: Store, glossary_id: str) -> object:
    return terminology_of(store.glossaries, "", glossary_id, "FR", "en", error)


def test_a_version_is_read_once_and_a_change_is_seen_at_once(
    store: Store, entry_reads: list[str]
) -> None:
    info = store.glossaries.create("", "g", [Dictionary("fr", "en", (("chien", "hound"),))])

    async def requests() -> None:
        first = await lookup(store, info.glossary_id)
        assert [m.target for m in first.find("Un chien court.")] == ["hound"]
        assert await lookup(store, info.glossary_id) is first
        assert len(entry_reads) == 1
        change = Dictionary("fr", "en", (("chat", "feline"),))
        store.glossaries.merge_dictionary("", info.glossary_id, change)  # (it reads them too)
        entry_reads.clear()
        changed = await lookup(store, info.glossary_id)
        assert [m.target for m in changed.find("Un chien et un chat.")] == ["hound", "feline"]
        assert len(entry_reads) == 1
        store.glossaries.delete("", info.glossary_id)
        with pytest.raises(NotFound) as gone:
            await lookup(store, info.glossary_id)
        assert gone.value.args == (404, "Glossary not found.")
        with pytest.raises(NotFound) as pair:
            await terminology_of(store.glossaries, "", info.glossary_id, "de", "en", error)
        assert pair.value.args[0] == 404

    asyncio.run(requests())


def test_requests_at_once_wait_for_one_build(store: Store, entry_reads: list[str]) -> None:
    entries = tuple((f"mot{i}", f"word{i}") for i in range(20_000))
    info = store.glossaries.create("", "big", [Dictionary("fr", "en", entries)])
    entry_reads.clear()

    async def requests() -> list:
        return await asyncio.gather(*(lookup(store, info.glossary_id) for _ in range(12)))

    found = asyncio.run(requests())
    assert len(entry_reads) == 1
    assert all(terminology is found[0] for terminology in found)
    assert len(found[0]) == 20_000


def test_the_least_recently_used_are_dropped_past_the_size(store: Store) -> None:
    made = [
        store.glossaries.create("", f"g{n}", [Dictionary("fr", "en", (("a", "b"), ("c", "d")))])
        for n in range(3)
    ]
    cache = TerminologyCache(max_terms=4)

    async def get(n: int) -> object:
        return await cache.get(store.glossaries, "", made[n].glossary_id, "fr", "en")

    async def requests() -> None:
        first = await get(0)
        await get(1)
        assert await get(0) is first  # held: 4 terms
        await get(2)  # 6 terms: the least recently used (1) goes
        assert await get(0) is first
        again = await get(1)  # built anew
        assert len(again) == 2

    asyncio.run(requests())
