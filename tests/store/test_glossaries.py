"""The glossary store, method by method, on SQLite and on a real PostgreSQL server, each from an
empty database (the migrations run from nothing): what is written reads back the same, in
order; one owner never reaches another's glossaries; a write is all or nothing; what is
committed survives a restart; two stores on one database (two replicas) see each other's
writes at once.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, Table, func, insert, select
from sqlalchemy.exc import IntegrityError

from service.store import (
    Dictionary,
    DictionaryInfo,
    DictionaryNotFound,
    GlossaryNotFound,
    InvalidDictionary,
    InvalidGlossary,
    Store,
    open_store,
)
from service.store import glossaries as glossaries_module
from service.store.bulk import bulk_insert
from service.store.schema import glossary_dictionaries, glossary_entries
from tests.store.conftest import settings_for

EN_DE = Dictionary("en", "de", (("hello", "hallo"), ("world", "Welt"), ("cat", "Katze")))
DE_EN = Dictionary("de", "en", (("Hund", "dog"),))
# What text formats and COPY must carry unchanged: tabs, newlines, backslashes, quotes, NUL-free
# Unicode beyond the BMP, leading and trailing spaces.
AWKWARD = Dictionary(
    "fr",
    "en",
    (
        ("tab\there", "a\ttab"),
        ("new\nline", "line\r\nbreak"),
        ("back\\slash \\N", "\\."),
        ("\"quoted\" 'term'", "é日本語🙂"),
        ("  padded  ", " "),
        ("", "empty source"),
    ),
)


def rows(store: Store, table: Table) -> int:
    with store.database.read() as connection:
        return connection.execute(select(func.count()).select_from(table)).scalar_one()


# --- each method -----------------------------------------------------------------------------


def test_create_returns_the_info_and_every_read_gives_it_back(store: Store) -> None:
    before = datetime.now(UTC)
    info = store.glossaries.create("alice", "My glossary", [EN_DE, DE_EN])
    after = datetime.now(UTC)

    assert uuid.UUID(info.glossary_id).version == 4
    assert (info.name, info.owner) == ("My glossary", "alice")
    assert info.creation_time.tzinfo is not None
    assert info.creation_time.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= info.creation_time <= after + timedelta(seconds=1)
    # Sorted by pair, whatever order they came in.
    assert info.dictionaries == (DictionaryInfo("de", "en", 1), DictionaryInfo("en", "de", 3))
    assert info.entry_count == 4

    assert store.glossaries.info("alice", info.glossary_id) == info
    assert store.glossaries.list("alice") == [info]
    assert store.glossaries.dictionaries("alice", info.glossary_id) == [DE_EN, EN_DE]
    assert store.glossaries.dictionary("alice", info.glossary_id, "en", "de") == EN_DE


def test_terms_come_back_exactly_as_given(store: Store) -> None:
    info = store.glossaries.create("", "awkward", [AWKWARD])
    assert store.glossaries.dictionary("", info.glossary_id, "fr", "en") == AWKWARD


def test_language_codes_are_lower_case(store: Store) -> None:
    info = store.glossaries.create("", "g", [Dictionary("EN", "De", EN_DE.entries)])
    assert info.dictionaries == (DictionaryInfo("en", "de", 3),)
    assert store.glossaries.dictionary("", info.glossary_id, "En", "DE") == EN_DE


def test_a_glossary_may_be_empty_and_a_dictionary_too(store: Store) -> None:
    info = store.glossaries.create("", "empty", [])
    assert info.dictionaries == ()
    assert store.glossaries.dictionaries("", info.glossary_id) == []
    info = store.glossaries.create("", "no entries", [Dictionary("en", "fr", ())])
    assert info.dictionaries == (DictionaryInfo("en", "fr", 0),)
    assert store.glossaries.dictionary("", info.glossary_id, "en", "fr").entries == ()


def test_list_is_by_creation_time_and_only_the_owners(store: Store) -> None:
    created = []
    for name in ("first", "second", "third"):
        created.append(store.glossaries.create("alice", name, [EN_DE]))
        store.glossaries.create("bob", f"bob's {name}", [DE_EN])
    assert [info.name for info in store.glossaries.list("alice")] == ["first", "second", "third"]
    assert store.glossaries.list("alice") == created
    assert store.glossaries.list("nobody") == []


def test_rename(store: Store) -> None:
    info = store.glossaries.create("", "old", [EN_DE])
    renamed = store.glossaries.rename("", info.glossary_id, "new")
    assert renamed.name == "new"
    assert renamed == store.glossaries.info("", info.glossary_id)
    assert (renamed.creation_time, renamed.dictionaries) == (info.creation_time, info.dictionaries)


def test_merge_adds_a_new_pair(store: Store) -> None:
    info = store.glossaries.create("", "g", [EN_DE])
    merged = store.glossaries.merge_dictionary("", info.glossary_id, DE_EN)
    assert merged.dictionaries == (DictionaryInfo("de", "en", 1), DictionaryInfo("en", "de", 3))
    assert store.glossaries.dictionary("", info.glossary_id, "de", "en") == DE_EN


def test_merge_into_a_pair_retargets_repeated_terms_and_appends_new_ones(store: Store) -> None:
    info = store.glossaries.create("", "g", [EN_DE])
    change = Dictionary("en", "de", (("bird", "Vogel"), ("world", "Erde"), ("hello", "hallo")))
    merged = store.glossaries.merge_dictionary("", info.glossary_id, change)
    assert merged.dictionaries == (DictionaryInfo("en", "de", 4),)
    entries = store.glossaries.dictionary("", info.glossary_id, "en", "de").entries
    assert entries == (("hello", "hallo"), ("world", "Erde"), ("cat", "Katze"), ("bird", "Vogel"))


def test_update_renames_and_merges_in_one_call(store: Store) -> None:
    info = store.glossaries.create("", "g", [EN_DE])
    more = Dictionary("en", "de", (("dog", "Hund"),))
    updated = store.glossaries.update("", info.glossary_id, name="h", dictionaries=[more, DE_EN])
    assert updated.name == "h"
    assert updated.dictionaries == (DictionaryInfo("de", "en", 1), DictionaryInfo("en", "de", 4))


def test_replace_dictionary(store: Store) -> None:
    info = store.glossaries.create("", "g", [EN_DE, DE_EN])
    replacement = Dictionary("en", "de", (("sun", "Sonne"),))
    replaced = store.glossaries.replace_dictionary("", info.glossary_id, replacement)
    assert replaced.dictionaries == (DictionaryInfo("de", "en", 1), DictionaryInfo("en", "de", 1))
    assert store.glossaries.dictionary("", info.glossary_id, "en", "de") == replacement
    assert store.glossaries.dictionary("", info.glossary_id, "de", "en") == DE_EN
    # A pair the glossary lacks is added.
    added = store.glossaries.replace_dictionary("", info.glossary_id, AWKWARD)
    assert [d.source_lang for d in added.dictionaries] == ["de", "en", "fr"]
    assert rows(store, glossary_entries) == 1 + 1 + len(AWKWARD.entries)  # the old rows went


def test_delete_dictionary(store: Store) -> None:
    info = store.glossaries.create("", "g", [EN_DE, DE_EN])
    store.glossaries.delete_dictionary("", info.glossary_id, "EN", "de")
    assert store.glossaries.info("", info.glossary_id).dictionaries == (
        DictionaryInfo("de", "en", 1),
    )
    with pytest.raises(DictionaryNotFound):
        store.glossaries.dictionary("", info.glossary_id, "en", "de")
    with pytest.raises(DictionaryNotFound):
        store.glossaries.delete_dictionary("", info.glossary_id, "en", "de")
    assert rows(store, glossary_entries) == 1


def test_delete_removes_the_glossary_and_everything_in_it(store: Store) -> None:
    kept = store.glossaries.create("", "kept", [DE_EN])
    info = store.glossaries.create("", "g", [EN_DE, AWKWARD])
    store.glossaries.delete("", info.glossary_id)
    for call in (
        lambda: store.glossaries.info("", info.glossary_id),
        lambda: store.glossaries.dictionaries("", info.glossary_id),
        lambda: store.glossaries.dictionary("", info.glossary_id, "en", "de"),
        lambda: store.glossaries.delete("", info.glossary_id),
    ):
        with pytest.raises(GlossaryNotFound):
            call()
    assert store.glossaries.list("") == [kept]
    assert rows(store, glossary_dictionaries) == 1 and rows(store, glossary_entries) == 1


def test_count_is_every_owners(store: Store) -> None:
    assert store.glossaries.count() == 0
    store.glossaries.create("alice", "a", [EN_DE])
    store.glossaries.create("bob", "b", [])
    assert store.glossaries.count() == 2
    store.glossaries.delete("bob", store.glossaries.list("bob")[0].glossary_id)
    assert store.glossaries.count() == 1


def test_unknown_ids_are_not_found(store: Store) -> None:
    for glossary_id in (str(uuid.uuid4()), "not-a-uuid", "", "' OR 1=1 --"):
        with pytest.raises(GlossaryNotFound):
            store.glossaries.info("", glossary_id)
        with pytest.raises(GlossaryNotFound):
            store.glossaries.dictionary("", glossary_id, "en", "de")


def test_every_change_bumps_the_version_and_a_failed_one_does_not(database_url: str) -> None:
    one, two = open_store(settings_for(database_url)), open_store(settings_for(database_url))
    try:
        info = one.glossaries.create("", "g", [EN_DE])
        assert info.version == one.glossaries.version("", info.glossary_id) == 1
        changes = [
            lambda gid: one.glossaries.rename("", gid, "h"),
            lambda gid: one.glossaries.merge_dictionary("", gid, DE_EN),
            lambda gid: one.glossaries.update("", gid, name="i", dictionaries=[DE_EN]),
            lambda gid: one.glossaries.replace_dictionary("", gid, AWKWARD),
            lambda gid: one.glossaries.delete_dictionary("", gid, "fr", "en"),
        ]
        for expected, change in enumerate(changes, start=2):
            change(info.glossary_id)
            assert one.glossaries.info("", info.glossary_id).version == expected
            assert two.glossaries.version("", info.glossary_id) == expected  # another replica
        with pytest.raises(DictionaryNotFound):
            one.glossaries.delete_dictionary("", info.glossary_id, "fr", "en")
        assert two.glossaries.info("", info.glossary_id).version == len(changes) + 1
        with pytest.raises(GlossaryNotFound):
            two.glossaries.version("someone else", info.glossary_id)
    finally:
        one.close()
        two.close()


# --- ownership ------------------------------------------------------------------------------


def test_another_owner_gets_not_found_from_every_method_and_changes_nothing(store: Store) -> None:
    info = store.glossaries.create("alice", "private", [EN_DE])
    glossary_id = info.glossary_id
    unknown = str(uuid.uuid4())
    calls = {
        "info": lambda owner, gid: store.glossaries.info(owner, gid),
        "version": lambda owner, gid: store.glossaries.version(owner, gid),
        "dictionaries": lambda owner, gid: store.glossaries.dictionaries(owner, gid),
        "dictionary": lambda owner, gid: store.glossaries.dictionary(owner, gid, "en", "de"),
        "rename": lambda owner, gid: store.glossaries.rename(owner, gid, "mine now"),
        "update": lambda owner, gid: store.glossaries.update(owner, gid, name="x"),
        "merge": lambda owner, gid: store.glossaries.merge_dictionary(owner, gid, DE_EN),
        "replace": lambda owner, gid: store.glossaries.replace_dictionary(owner, gid, DE_EN),
        "delete_dictionary": lambda owner, gid: store.glossaries.delete_dictionary(
            owner, gid, "en", "de"
        ),
        "delete": lambda owner, gid: store.glossaries.delete(owner, gid),
    }
    for name, call in calls.items():
        for owner in ("bob", ""):  # another key, and no key at all
            with pytest.raises(GlossaryNotFound) as theirs:
                call(owner, glossary_id)
            # The same answer as for an id that does not exist: nothing tells them apart.
            with pytest.raises(GlossaryNotFound) as nobodys:
                call(owner, unknown)
            assert type(theirs.value) is type(nobodys.value), name
            assert str(theirs.value).replace(glossary_id, "ID") == str(nobodys.value).replace(
                unknown, "ID"
            ), name
    assert store.glossaries.list("bob") == []
    assert store.glossaries.info("alice", glossary_id) == info
    assert store.glossaries.dictionary("alice", glossary_id, "en", "de") == EN_DE


# --- refused input, all or nothing -------------------------------------------------------


def test_a_source_term_given_twice_is_refused_and_nothing_is_written(store: Store) -> None:
    twice = Dictionary("en", "de", (("a", "1"), ("b", "2"), ("a", "3")))
    with pytest.raises(InvalidDictionary, match="'a'"):
        store.glossaries.create("", "g", [DE_EN, twice])
    assert store.glossaries.count() == 0
    info = store.glossaries.create("", "g", [EN_DE])
    for write in (store.glossaries.merge_dictionary, store.glossaries.replace_dictionary):
        with pytest.raises(InvalidDictionary):
            write("", info.glossary_id, twice)
    assert store.glossaries.dictionary("", info.glossary_id, "en", "de") == EN_DE


def test_a_pair_given_twice_is_refused(store: Store) -> None:
    with pytest.raises(InvalidDictionary, match="en->de"):
        store.glossaries.create("", "g", [EN_DE, Dictionary("EN", "DE", ())])
    assert store.glossaries.count() == 0


def test_nul_characters_and_bad_language_codes_are_refused(store: Store) -> None:
    """PostgreSQL's text cannot hold a NUL: refused on every database alike, before writing."""
    info = store.glossaries.create("", "g", [EN_DE])
    for bad in (
        Dictionary("en", "fr", (("a\x00b", "c"),)),
        Dictionary("en", "fr", (("a", "c\x00"),)),
        Dictionary("", "fr", ()),
        Dictionary("en", "x" * 36, ()),
    ):
        with pytest.raises(InvalidDictionary):
            store.glossaries.create("", "g", [bad])
        with pytest.raises(InvalidDictionary):
            store.glossaries.merge_dictionary("", info.glossary_id, bad)
    with pytest.raises(InvalidGlossary, match="NUL"):
        store.glossaries.rename("", info.glossary_id, "a\x00b")
    assert store.glossaries.list("") == [info]


def test_a_create_that_fails_half_way_leaves_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database fails at the second dictionary's entries, after the glossary, the first
    dictionary and its entries were written: the transaction takes all of it back."""
    inserted = []

    def failing_insert(connection: Connection, table: Table, rows: Iterable[tuple]) -> None:
        if inserted:  # the database refuses a row: a dictionary that does not exist
            orphan = {"dictionary_id": -1, "ordinal": 0, "source": "a", "target": "b"}
            connection.execute(insert(glossary_entries).values(orphan))
        bulk_insert(connection, table, rows)
        inserted.append(table.name)

    monkeypatch.setattr(glossaries_module, "bulk_insert", failing_insert)
    with pytest.raises(IntegrityError):
        store.glossaries.create("", "g", [EN_DE, DE_EN])
    assert inserted == ["glossary_entries"]
    assert store.glossaries.count() == 0
    assert rows(store, glossary_dictionaries) == 0 and rows(store, glossary_entries) == 0
    monkeypatch.undo()
    assert store.glossaries.create("", "g", [EN_DE]).dictionaries  # and it is usable


# --- durability, replicas, concurrency -------------------------------------------------------


def test_what_is_committed_survives_a_restart(database_url: str) -> None:
    first = open_store(settings_for(database_url))
    info = first.glossaries.create("alice", "kept", [EN_DE, AWKWARD])
    first.close()
    second = open_store(settings_for(database_url))
    try:
        assert second.glossaries.list("alice") == [info]
        assert second.glossaries.dictionaries("alice", info.glossary_id) == [EN_DE, AWKWARD]
    finally:
        second.close()


def test_two_stores_on_one_database_see_each_others_writes(database_url: str) -> None:
    """Two replicas: nothing is cached in a process, so each sees the other's changes."""
    one, two = open_store(settings_for(database_url)), open_store(settings_for(database_url))
    try:
        info = one.glossaries.create("alice", "shared", [EN_DE])
        assert two.glossaries.info("alice", info.glossary_id) == info
        two.glossaries.rename("alice", info.glossary_id, "renamed by two")
        two.glossaries.merge_dictionary("alice", info.glossary_id, DE_EN)
        assert one.glossaries.info("alice", info.glossary_id).name == "renamed by two"
        assert one.glossaries.dictionary("alice", info.glossary_id, "de", "en") == DE_EN
        one.glossaries.delete("alice", info.glossary_id)
        with pytest.raises(GlossaryNotFound):
            two.glossaries.info("alice", info.glossary_id)
        assert one.glossaries.count() == two.glossaries.count() == 0
    finally:
        one.close()
        two.close()


def test_concurrent_merges_into_one_dictionary_lose_nothing(store: Store) -> None:
    """Writers that meet wait for each other (SQLite: BEGIN IMMEDIATE and the busy timeout;
    PostgreSQL: the glossary row locked): every term of every writer arrives."""
    info = store.glossaries.create("", "g", [Dictionary("en", "de", ())])
    writers, terms = 8, 25
    failures: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            for term in range(terms):
                entry = ((f"w{writer}-t{term}", f"{writer}:{term}"),)
                store.glossaries.merge_dictionary(
                    "", info.glossary_id, Dictionary("en", "de", entry)
                )
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    entries = store.glossaries.dictionary("", info.glossary_id, "en", "de").entries
    assert len(entries) == len(set(entries)) == writers * terms
    assert store.glossaries.info("", info.glossary_id).entry_count == writers * terms


# --- a million entries -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_million_entries_round_trip_in_order(store: Store) -> None:
    count = 1_000_000
    entries = tuple((f"term {i:07d} source", f"Begriff {count - i} Ziel") for i in range(count))
    started = time.perf_counter()
    info = store.glossaries.create("", "big", [Dictionary("en", "de", entries)])
    created = time.perf_counter()
    back = store.glossaries.dictionary("", info.glossary_id, "en", "de")
    read = time.perf_counter()
    assert info.dictionaries == (DictionaryInfo("en", "de", count),)
    assert back.entries == entries  # every one, in the order given
    # A merge into it: one retargeted in place, one added at the end.
    change = Dictionary("en", "de", (("term 0500000 source", "neu"), ("extra", "dazu")))
    store.glossaries.merge_dictionary("", info.glossary_id, change)
    merged = store.glossaries.dictionary("", info.glossary_id, "en", "de").entries
    assert len(merged) == count + 1
    assert merged[500_000] == ("term 0500000 source", "neu") and merged[-1] == ("extra", "dazu")
    store.glossaries.delete("", info.glossary_id)
    assert rows(store, glossary_entries) == 0
    print(f"1M entries: create {created - started:.1f} s, read {read - created:.1f} s")
