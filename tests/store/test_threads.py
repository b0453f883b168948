"""The store's threads as a request meets them (service/store/threads.py): a request that waits
past NMT_DATABASE_TIMEOUT_SECONDS gets StoreUnavailable, a 503 that tells its client to retry,
and then nothing it asked for may happen afterwards. Against SQLite and a real PostgreSQL, whose
writers are held by another connection's lock, released once the request has been refused."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from service.store import Dictionary, DocumentNotFound, Store, StoreUnavailable
from service.store.threads import StoreThreads, may_commit
from tests.store.test_documents import upload

TIMEOUT_SECONDS = 0.3


@pytest.fixture
def one_thread(store: Store) -> Store:
    """The store with one thread, so that a call queued behind another one ends after it."""
    return Store(store.database, StoreThreads(TIMEOUT_SECONDS, threads=1))


@contextmanager
def writers_held(store: Store) -> Iterator[None]:
    """Every writer of the store's database waits until the block ends (a migration, an
    operator's transaction)."""
    url = store.database.url
    if store.database.dialect == "sqlite":
        holder = sqlite3.connect(url.database or "", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        return
    engine = create_engine(url)
    with engine.connect() as holder:
        holder.execute(text("LOCK TABLE glossaries, document_jobs IN ACCESS EXCLUSIVE MODE"))
        try:
            yield
        finally:
            holder.rollback()
    engine.dispose()


def refused_while_held(store: Store, call: Callable[..., Any], *args: Any) -> None:
    """call(*args) as a request runs it, refused while the writers are held; returns once the
    call has ended on its thread, the lock released."""

    async def request() -> None:
        refused = pytest.raises(StoreUnavailable, match=r"did not answer within 0\.3 s")
        with writers_held(store), refused:
            await store.threads.run(call, *args)
        # Queued behind the refused call on the one thread: returns once that one has ended.
        await store.threads.run_unbounded(lambda: None)

    asyncio.run(request())


def test_a_glossary_refused_for_a_timeout_is_not_created_afterwards(one_thread: Store) -> None:
    """Else the client, told to retry (503), would create it twice."""
    dictionary = Dictionary("fr", "en", (("chat", "cat"),))
    refused_while_held(one_thread, one_thread.glossaries.create, "", "g", [dictionary])
    assert one_thread.glossaries.list("") == []
    # And the same call in time, no lock held, does commit.
    created = asyncio.run(
        one_thread.threads.run(one_thread.glossaries.create, "", "g", [dictionary])
    )
    assert [info.glossary_id for info in one_thread.glossaries.list("")] == [created.glossary_id]


def test_a_glossary_delete_refused_for_a_timeout_leaves_it(one_thread: Store) -> None:
    info = one_thread.glossaries.create("", "g", [Dictionary("fr", "en", (("chat", "cat"),))])
    refused_while_held(one_thread, one_thread.glossaries.delete, "", info.glossary_id)
    assert one_thread.glossaries.info("", info.glossary_id).entry_count == 1


def test_a_document_download_refused_for_a_timeout_can_be_downloaded_again(
    one_thread: Store,
) -> None:
    """A result is delivered once (then deleted): a download that failed must not use it."""
    documents = one_thread.documents
    document_id, key = upload(one_thread)
    assert documents.claim("w1", lease_seconds=30) is not None
    assert documents.finish(document_id, "w1", b"translated")
    refused_while_held(one_thread, documents.result, document_id, key, True)
    assert documents.result(document_id, key, once=True) == ("a.docx", b"translated")
    with pytest.raises(DocumentNotFound):
        documents.result(document_id, key, once=True)


def test_background_work_is_never_rolled_back(one_thread: Store) -> None:
    """The document workers' calls (run_unbounded) wait for the lock and commit."""

    async def background() -> None:
        with writers_held(one_thread):
            waiting = asyncio.ensure_future(
                one_thread.threads.run_unbounded(
                    one_thread.glossaries.create, "", "g", [Dictionary("fr", "en", ())]
                )
            )
            await asyncio.sleep(2 * TIMEOUT_SECONDS)
            assert not waiting.done()
        await waiting

    asyncio.run(background())
    assert len(one_thread.glossaries.list("")) == 1


def test_a_commit_already_sent_is_waited_for_once_more() -> None:
    """Past the timeout, a call whose commit has begun is not abandoned (its outcome is the
    database's): its request waits once more as long, and then says it may have been made."""
    # Seconds, not tenths: the commit must begin within the first wait on a busy machine too.
    timeout = 1.0
    threads = StoreThreads(timeout, threads=1)

    def commit_taking(seconds: float) -> str:
        assert may_commit()  # as Database.write asks before it commits
        time.sleep(seconds)
        return "committed"

    try:
        assert asyncio.run(threads.run(commit_taking, 1.5 * timeout)) == "committed"
        with pytest.raises(StoreUnavailable, match="did not confirm a change"):
            asyncio.run(threads.run(commit_taking, 3 * timeout))
    finally:
        threads.close()
