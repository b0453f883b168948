"""Whose glossaries a request sees, and a glossary's terms for a translation request: what
the translating routes of every dialect share with the glossary routes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

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
    """The terms of glossary `glossary_id`'s dictionary for the pair, read on the store's
    threads, ready to be found in text; `error(status, message)` makes the dialect's error for an
    unknown glossary (404, also another key's) or a glossary without that pair (400)."""
    if not glossary_id.isascii():  # ids are UUIDs; a lone surrogate would fail the driver
        raise error(404, "Glossary not found.")
    try:
        dictionary = await glossaries.threads.run(
            glossaries.dictionary, owner, glossary_id, source_lang, target_lang
        )
    except GlossaryNotFound:
        raise error(404, "Glossary not found.") from None
    except DictionaryNotFound:
        pair = f"{source_lang.upper()}->{target_lang.upper()}"
        raise error(400, f"The glossary has no dictionary for {pair}.") from None
    return await run_in_threadpool(Terminology, dictionary.entries)
