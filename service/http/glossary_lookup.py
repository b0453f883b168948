"""Whose glossaries a request sees, and a glossary's terms for a translation request: what
the translating routes of every dialect share with the glossary routes."""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Callable
from weakref import WeakKeyDictionary

from starlette.concurrency import run_in_threadpool

from service.serving.access import ApiKeys
from service.serving.terminology import Terminology
from service.store.glossaries import DictionaryNotFound, GlossaryNotFound, GlossaryStore


def owner_of(keys: ApiKeys, key: str | None) -> str:
    """Whose glossaries a request sees: with keys configured, an opaque id of its key (never
    the key: the database holds no secret), else "" (an open server's glossaries are everyone's,
    whatever key a client sends)."""
    if not keys.enabled or not key:
        return ""
    digest = hashlib.sha256(b"nmt-glossary-owner\0" + key.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


async def terminology_of(
    glossaries: GlossaryStore,
    owner: str,
    glossary_id: str,
    source_lang: str,
    target_lang: str,
    error: Callable[[int, str], Exception],
) -> Terminology:
    """The terms of glossary `glossary_id`'s dictionary for the pair, ready to be found in text
    (TerminologyCache: built once a version); `error(status, message)` makes the dialect's error
    for an unknown glossary (404, also another key's) or a glossary without that pair (400)."""
    if not glossary_id.isascii():  # ids are UUIDs; a lone surrogate would fail the driver
        raise error(404, "Glossary not found.")
    cache = _caches.setdefault(glossaries, TerminologyCache())
    try:
        return await cache.get(glossaries, owner, glossary_id, source_lang, target_lang)
    except GlossaryNotFound:
        raise error(404, "Glossary not found.") from None
    except DictionaryNotFound:
        pair = f"{source_lang.upper()}->{target_lang.upper()}"
        raise error(400, f"The glossary has no dictionary for {pair}.") from None


# Terms of every terminology kept, together (a 100,000-entry one is about 40 MB).
CACHED_TERMS = 400_000

_Key = tuple[str, str, str, str]  # owner, glossary id, source and target language


class TerminologyCache:
    """Terminologies built from stored dictionaries, each kept while its glossary stays at the
    version it was built from, the least recently used dropped past CACHED_TERMS terms.

    A client sends its glossary_id with every translation. Reading a 100,000-entry dictionary
    and indexing it took 0.7 s of Python a request, holding the GIL: ten such requests at once
    held /healthz 0.9 s, thirty made half of them wait past the database timeout (503). Now a
    request reads the glossary's version (one row), and only a new version is read and built,
    once however many requests want it at that moment. The store stays the truth: a change
    made through any replica bumps the version, and the next request here sees it."""

    def __init__(self, max_terms: int = CACHED_TERMS) -> None:
        self.max_terms = max_terms
        self._held: OrderedDict[_Key, tuple[int, Terminology, int]] = OrderedDict()  # + terms
        self._terms = 0  # held, together
        self._building: dict[tuple[_Key, int], asyncio.Future[Terminology]] = {}

    async def get(
        self,
        glossaries: GlossaryStore,
        owner: str,
        glossary_id: str,
        source_lang: str,
        target_lang: str,
    ) -> Terminology:
        key = (owner, glossary_id, source_lang.lower(), target_lang.lower())
        version = await glossaries.threads.run(glossaries.version, owner, glossary_id)
        held = self._held.get(key)
        if held is not None and held[0] == version:
            self._held.move_to_end(key)
            return held[1]
        building = self._building.get((key, version))
        if building is None:
            building = asyncio.ensure_future(self._build(glossaries, key))
            self._building[(key, version)] = building
            building.add_done_callback(lambda _: self._building.pop((key, version), None))
        # Shielded: a request that gives up does not stop the build the others wait for.
        return await asyncio.shield(building)

    async def _build(self, glossaries: GlossaryStore, key: _Key) -> Terminology:
        version, dictionary = await glossaries.threads.run(glossaries.versioned_dictionary, *key)
        terminology = await run_in_threadpool(Terminology, dictionary.entries)
        held = self._held.get(key)
        if held is None or held[0] < version:
            self._hold(key, version, terminology)
        return terminology

    def _hold(self, key: _Key, version: int, terminology: Terminology) -> None:
        if key in self._held:
            self._terms -= self._held.pop(key)[2]
        self._held[key] = (version, terminology, len(terminology))
        self._terms += len(terminology)
        while self._terms > self.max_terms:
            self._terms -= self._held.popitem(last=False)[1][2]


# One cache per store (tests open several).
_caches: WeakKeyDictionary[GlossaryStore, TerminologyCache] = WeakKeyDictionary()
