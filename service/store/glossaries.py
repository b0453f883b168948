"""Glossaries: named sets of dictionaries, one per language pair, each a list of (source term,
target term) entries; what DeepL's /v2 and /v3 glossary APIs manage and translations enforce.

Every method takes the owner (an opaque id the caller derives from the API key; "" when keys
are off) and sees only that owner's glossaries: another owner's glossary is GlossaryNotFound,
the same as one that does not exist, so that ids cannot be probed. Each method is one
transaction; nothing is cached in the process, so every replica on one database sees the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Delete, bindparam, delete, func, insert, select, update

from service.store.bulk import bulk_insert, chunks
from service.store.schema import glossaries, glossary_dictionaries, glossary_entries

if TYPE_CHECKING:
    from service.store.database import Database
    from service.store.threads import StoreThreads

# Changed entries go to the database this many rows per executemany (bounded memory).
UPDATE_CHUNK = 10_000
# Rows fetched at a time when reading entries back.
READ_CHUNK = 10_000


@dataclass(frozen=True)
class Dictionary:
    """One language pair's entries. Language codes are kept lower-case; `entries` in the
    order given, source terms unique (the store refuses duplicates: InvalidDictionary)."""

    source_lang: str
    target_lang: str
    entries: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "source_lang", self.source_lang.lower())
        object.__setattr__(self, "target_lang", self.target_lang.lower())
        if not isinstance(self.entries, tuple):
            object.__setattr__(self, "entries", tuple(self.entries))

    @property
    def pair(self) -> tuple[str, str]:
        return self.source_lang, self.target_lang


@dataclass(frozen=True)
class DictionaryInfo:
    source_lang: str
    target_lang: str
    entry_count: int


@dataclass(frozen=True)
class GlossaryInfo:
    glossary_id: str  # str(uuid4())
    name: str
    owner: str
    creation_time: datetime  # timezone-aware, UTC
    dictionaries: tuple[DictionaryInfo, ...]  # sorted by (source_lang, target_lang)
    # 1 when created, one more at every change (name, dictionaries, entries): what was read
    # at one version is what the glossary holds while it stays at it, on every replica.
    version: int = 1

    @property
    def entry_count(self) -> int:
        """Entries of every dictionary (DeepL v2's `entry_count` of a one-pair glossary)."""
        return sum(d.entry_count for d in self.dictionaries)


class GlossaryNotFound(Exception):
    """No glossary of this id for this owner (it does not exist, or it is someone else's)."""


class DictionaryNotFound(Exception):
    """The glossary has no dictionary for this language pair."""


class InvalidGlossary(ValueError):
    """Input the store refuses, before writing anything (the message says what is wrong)."""


class InvalidDictionary(InvalidGlossary):
    """A dictionary the store refuses: a source term or a pair given twice, a NUL character,
    an empty or overlong language code."""


class GlossaryStore:
    def __init__(self, database: Database, threads: StoreThreads) -> None:
        self._database = database
        self.threads = threads  # where the event loop runs these methods

    # --- reads ---------------------------------------------------------------------------

    def list(self, owner: str) -> list[GlossaryInfo]:
        """The owner's glossaries, oldest first."""
        query = (
            select(*_INFO_COLUMNS)
            .select_from(_GLOSSARY_WITH_DICTIONARIES)
            .where(glossaries.c.owner == owner)
        )
        with self._database.read() as connection:
            infos = _infos(connection.execute(query))
        return sorted(infos, key=lambda info: (info.creation_time, info.glossary_id))

    def info(self, owner: str, glossary_id: str) -> GlossaryInfo:
        with self._database.read() as connection:
            return _info(connection, owner, glossary_id)

    def dictionaries(self, owner: str, glossary_id: str) -> list[Dictionary]:
        """Every dictionary of the glossary, entries included, by language pair."""
        with self._database.read() as connection:
            info = _info(connection, owner, glossary_id)
            rows = connection.execute(
                select(
                    glossary_dictionaries.c.id,
                    glossary_dictionaries.c.source_lang,
                    glossary_dictionaries.c.target_lang,
                ).where(glossary_dictionaries.c.glossary_id == info.glossary_id)
            ).all()
            return [
                Dictionary(source, target, _entries(connection, dictionary_id))
                for dictionary_id, source, target in sorted(rows, key=lambda row: row[1:])
            ]

    def dictionary(
        self, owner: str, glossary_id: str, source_lang: str, target_lang: str
    ) -> Dictionary:
        """One language pair's entries, in their order."""
        with self._database.read() as connection:
            return self._dictionary(connection, owner, glossary_id, source_lang, target_lang)

    @staticmethod
    def _dictionary(
        connection: Connection, owner: str, glossary_id: str, source_lang: str, target_lang: str
    ) -> Dictionary:
        source_lang, target_lang = source_lang.lower(), target_lang.lower()
        dictionary_id = connection.execute(
            select(glossary_dictionaries.c.id)
            .join(glossaries)
            .where(
                glossaries.c.id == glossary_id,
                glossaries.c.owner == owner,
                glossary_dictionaries.c.source_lang == source_lang,
                glossary_dictionaries.c.target_lang == target_lang,
            )
        ).scalar()
        if dictionary_id is None:
            _info(connection, owner, glossary_id)  # GlossaryNotFound, if that is why
            raise DictionaryNotFound(
                f"glossary {glossary_id} has no dictionary {source_lang}->{target_lang}"
            )
        return Dictionary(source_lang, target_lang, _entries(connection, dictionary_id))

    def versioned_dictionary(
        self, owner: str, glossary_id: str, source_lang: str, target_lang: str
    ) -> tuple[int, Dictionary]:
        """The glossary's version and one pair's entries, read together (one transaction): what
        a copy kept elsewhere is known by."""
        with self._database.read() as connection:
            version = connection.execute(
                select(glossaries.c.version).where(
                    glossaries.c.id == glossary_id, glossaries.c.owner == owner
                )
            ).scalar()
            if version is None:
                raise GlossaryNotFound(glossary_id)
            return version, self._dictionary(
                connection, owner, glossary_id, source_lang, target_lang
            )

    def version(self, owner: str, glossary_id: str) -> int:
        """The glossary's version (GlossaryInfo.version) alone: one row by its key, cheap
        enough to check at every use whether a copy held elsewhere is still current."""
        with self._database.read() as connection:
            found = connection.execute(
                select(glossaries.c.version).where(
                    glossaries.c.id == glossary_id, glossaries.c.owner == owner
                )
            ).scalar()
        if found is None:
            raise GlossaryNotFound(glossary_id)
        return found

    def count(self) -> int:
        """Glossaries of every owner (the nmt_glossaries gauge)."""
        with self._database.read() as connection:
            return connection.execute(select(func.count()).select_from(glossaries)).scalar_one()

    # --- writes --------------------------------------------------------------------------

    def create(self, owner: str, name: str, dictionaries: Sequence[Dictionary]) -> GlossaryInfo:
        """A new glossary, all of it or (on any failure, a killed process included) none."""
        _check(name, dictionaries)
        glossary_id = str(uuid.uuid4())
        with self._database.write() as connection:
            connection.execute(
                insert(glossaries).values(
                    id=glossary_id,
                    owner=owner,
                    name=name,
                    creation_time=datetime.now(UTC),
                    version=1,
                )
            )
            for dictionary in dictionaries:
                _insert_dictionary(connection, glossary_id, dictionary)
            return _info(connection, owner, glossary_id)

    def update(
        self,
        owner: str,
        glossary_id: str,
        name: str | None = None,
        dictionaries: Sequence[Dictionary] = (),
    ) -> GlossaryInfo:
        """DeepL v3's PATCH in one transaction: a new name (if given), and each dictionary
        merged (merge_dictionary)."""
        _check(name, dictionaries)
        with self._database.write() as connection:
            _lock(connection, owner, glossary_id)
            if name is not None:
                connection.execute(
                    update(glossaries).where(glossaries.c.id == glossary_id).values(name=name)
                )
            for dictionary in dictionaries:
                _merge_dictionary(connection, glossary_id, dictionary)
            return _info(connection, owner, glossary_id)

    def rename(self, owner: str, glossary_id: str, name: str) -> GlossaryInfo:
        return self.update(owner, glossary_id, name=name)

    def merge_dictionary(
        self, owner: str, glossary_id: str, dictionary: Dictionary
    ) -> GlossaryInfo:
        """Add the pair if the glossary has none; else merge its entries: a source term given
        again takes the new target (in its old place), new ones come after the others."""
        return self.update(owner, glossary_id, dictionaries=[dictionary])

    def replace_dictionary(
        self, owner: str, glossary_id: str, dictionary: Dictionary
    ) -> GlossaryInfo:
        """The pair's entries become exactly these (the pair is added if new)."""
        _check_entries(dictionary)
        with self._database.write() as connection:
            _lock(connection, owner, glossary_id)
            connection.execute(_delete_dictionary(glossary_id, *dictionary.pair))
            _insert_dictionary(connection, glossary_id, dictionary)
            return _info(connection, owner, glossary_id)

    def delete_dictionary(
        self, owner: str, glossary_id: str, source_lang: str, target_lang: str
    ) -> None:
        source_lang, target_lang = source_lang.lower(), target_lang.lower()
        with self._database.write() as connection:
            _lock(connection, owner, glossary_id)
            deleted = connection.execute(
                _delete_dictionary(glossary_id, source_lang, target_lang)
            ).rowcount
            if not deleted:
                raise DictionaryNotFound(
                    f"glossary {glossary_id} has no dictionary {source_lang}->{target_lang}"
                )

    def delete(self, owner: str, glossary_id: str) -> None:
        """The glossary and everything in it."""
        with self._database.write() as connection:
            deleted = connection.execute(
                delete(glossaries).where(
                    glossaries.c.id == glossary_id, glossaries.c.owner == owner
                )
            ).rowcount
            if not deleted:
                raise GlossaryNotFound(glossary_id)


# --- queries ---------------------------------------------------------------------------------

_GLOSSARY_WITH_DICTIONARIES = glossaries.outerjoin(glossary_dictionaries)
_INFO_COLUMNS = (
    glossaries.c.id,
    glossaries.c.name,
    glossaries.c.owner,
    glossaries.c.creation_time,
    glossaries.c.version,
    glossary_dictionaries.c.source_lang,
    glossary_dictionaries.c.target_lang,
    glossary_dictionaries.c.entry_count,
)


def _infos(rows: Iterable) -> list[GlossaryInfo]:
    """GlossaryInfos from rows of _INFO_COLUMNS: one row per dictionary (one with NULLs for a
    glossary without any). The order of language pairs is Python's, not the database
    collation's, so that it is the same on every database."""
    found: dict[str, tuple[tuple, int, list[DictionaryInfo]]] = {}
    for glossary_id, name, owner, created, version, source, target, entry_count in rows:
        fields = (glossary_id, name, owner, created)
        _, _, dictionaries = found.setdefault(glossary_id, (fields, version, []))
        if source is not None:
            dictionaries.append(DictionaryInfo(source, target, entry_count))
    return [
        GlossaryInfo(
            *fields,
            dictionaries=tuple(sorted(dictionaries, key=lambda d: (d.source_lang, d.target_lang))),
            version=version,
        )
        for fields, version, dictionaries in found.values()
    ]


def _info(connection: Connection, owner: str, glossary_id: str) -> GlossaryInfo:
    query = (
        select(*_INFO_COLUMNS)
        .select_from(_GLOSSARY_WITH_DICTIONARIES)
        .where(glossaries.c.id == glossary_id, glossaries.c.owner == owner)
    )
    infos = _infos(connection.execute(query))
    if not infos:
        raise GlossaryNotFound(glossary_id)
    return infos[0]


def _lock(connection: Connection, owner: str, glossary_id: str) -> None:
    """Before a change: the glossary is the owner's, its version one more, and its row locked
    against other writers until the transaction ends (an UPDATE locks the row on PostgreSQL;
    SQLite's BEGIN IMMEDIATE has locked the database). A change that fails rolls back the
    version with the rest."""
    bumped = connection.execute(
        update(glossaries)
        .where(glossaries.c.id == glossary_id, glossaries.c.owner == owner)
        .values(version=glossaries.c.version + 1)
    ).rowcount
    if not bumped:
        raise GlossaryNotFound(glossary_id)


def _entries(connection: Connection, dictionary_id: int) -> tuple[tuple[str, str], ...]:
    rows = connection.execute(
        select(glossary_entries.c.source, glossary_entries.c.target)
        .where(glossary_entries.c.dictionary_id == dictionary_id)
        .order_by(glossary_entries.c.ordinal)
        .execution_options(yield_per=READ_CHUNK)
    )
    return tuple((source, target) for source, target in rows)


def _insert_dictionary(connection: Connection, glossary_id: str, dictionary: Dictionary) -> None:
    dictionary_id = connection.execute(
        insert(glossary_dictionaries).values(
            glossary_id=glossary_id,
            source_lang=dictionary.source_lang,
            target_lang=dictionary.target_lang,
            entry_count=len(dictionary.entries),
        )
    ).inserted_primary_key[0]
    _insert_entries(connection, dictionary_id, enumerate(dictionary.entries))


def _insert_entries(
    connection: Connection, dictionary_id: int, numbered: Iterable[tuple[int, tuple[str, str]]]
) -> None:
    """(ordinal, (source, target)) pairs as rows, in the column order of glossary_entries."""
    rows = ((dictionary_id, ordinal, source, target) for ordinal, (source, target) in numbered)
    bulk_insert(connection, glossary_entries, rows)


def _merge_dictionary(connection: Connection, glossary_id: str, dictionary: Dictionary) -> None:
    found = connection.execute(
        select(glossary_dictionaries.c.id, glossary_dictionaries.c.entry_count).where(
            glossary_dictionaries.c.glossary_id == glossary_id,
            glossary_dictionaries.c.source_lang == dictionary.source_lang,
            glossary_dictionaries.c.target_lang == dictionary.target_lang,
        )
    ).first()
    if found is None:
        _insert_dictionary(connection, glossary_id, dictionary)
        return
    dictionary_id, count = found
    # source term -> (ordinal, target) of what the dictionary holds now
    held = {
        source: (ordinal, target)
        for ordinal, source, target in connection.execute(
            select(glossary_entries.c.ordinal, glossary_entries.c.source, glossary_entries.c.target)
            .where(glossary_entries.c.dictionary_id == dictionary_id)
            .execution_options(yield_per=READ_CHUNK)
        )
    }
    changed, added = [], []
    for source, target in dictionary.entries:
        if source not in held:
            added.append((count + len(added), (source, target)))
        elif held[source][1] != target:
            changed.append({"row": held[source][0], "new_target": target})
    retarget = (
        update(glossary_entries)
        .where(
            glossary_entries.c.dictionary_id == dictionary_id,
            glossary_entries.c.ordinal == bindparam("row"),
        )
        .values(target=bindparam("new_target"))
    )
    for chunk in chunks(changed, UPDATE_CHUNK):
        connection.execute(retarget, chunk)
    _insert_entries(connection, dictionary_id, added)
    if added:
        connection.execute(
            update(glossary_dictionaries)
            .where(glossary_dictionaries.c.id == dictionary_id)
            .values(entry_count=count + len(added))
        )


def _delete_dictionary(glossary_id: str, source_lang: str, target_lang: str) -> Delete:
    return delete(glossary_dictionaries).where(
        glossary_dictionaries.c.glossary_id == glossary_id,
        glossary_dictionaries.c.source_lang == source_lang,
        glossary_dictionaries.c.target_lang == target_lang,
    )


# --- checks ----------------------------------------------------------------------------------

# The longest language code the schema holds (a BCP 47 tag fits).
LANG_MAX = 35


def _check(name: str | None, dictionaries: Sequence[Dictionary]) -> None:
    """Refuse what the store cannot keep faithfully, before anything is written: a NUL
    character (PostgreSQL's text cannot hold one), a pair or a source term given twice."""
    if name is not None and "\x00" in name:
        raise InvalidGlossary("the name holds a NUL character")
    pairs = [d.pair for d in dictionaries]
    if len(set(pairs)) != len(pairs):
        twice = next(pair for pair in pairs if pairs.count(pair) > 1)
        raise InvalidDictionary(f"the language pair {twice[0]}->{twice[1]} is given twice")
    for dictionary in dictionaries:
        _check_entries(dictionary)


def _check_entries(dictionary: Dictionary) -> None:
    pair = f"{dictionary.source_lang}->{dictionary.target_lang}"
    for lang in dictionary.pair:
        if not lang or len(lang) > LANG_MAX or "\x00" in lang:
            raise InvalidDictionary(f"{lang!r} is not a language code ({pair})")
    seen: set[str] = set()
    for source, target in dictionary.entries:
        if source in seen:
            raise InvalidDictionary(f"the source term {source!r} is given twice ({pair})")
        seen.add(source)
        if "\x00" in source or "\x00" in target:
            raise InvalidDictionary(f"the entry {source!r} holds a NUL character ({pair})")
