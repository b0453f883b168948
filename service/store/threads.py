"""The threads the store's calls run on: how the event loop reaches a synchronous store.

A pool of its own, not asyncio's default one. A database that hangs (a server frozen, a table
locked by a migration or an operator) holds a thread for as long as it does not answer. In the
default pool such calls would take the threads that parse and prepare translations, which need
no database: a frozen PostgreSQL once held a plain translation for 30 s. Here they hold the
store's threads only.

A request waits for its call at most NMT_DATABASE_TIMEOUT_SECONDS and then gets StoreUnavailable
(a 503 to retry), and a 503 means that nothing changed: a call not started yet is dropped, and
one already running (it cannot be stopped: it waits on the database) is abandoned, so that its
write is rolled back when the database answers instead of committed (`may_commit`, asked by
Database.write before it commits). Otherwise a client told to retry would create its glossary
twice, or a document result downloaded once would be gone though its download failed. Only a
commit already sent when the time runs out is waited for, once more as long, since its outcome
is the database's to tell. Background work (the document workers) waits as long as it takes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, TypeVar

from service.store.errors import StoreUnavailable

T = TypeVar("T")

# Store calls running at once: above the few the document workers hold (a claim, a lease
# renewal, a chunk saved), and below the connection pool's limit (SQLAlchemy's 5 + 10
# overflow), so that a thread that runs always gets a connection without waiting for one.
STORE_THREADS = 8


class _RequestCall:
    """A request's store call, as seen by both sides: the thread running it and the request
    waiting for it. Whichever comes first decides: the thread beginning its commit, or the
    request giving up on it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._committing = False
        self._abandoned = False

    def begin_commit(self) -> bool:
        """The thread's side: False if the request gave up (roll back instead)."""
        with self._lock:
            self._committing = not self._abandoned
            return self._committing

    def abandon(self) -> bool:
        """The request's side: False if the commit has already begun."""
        with self._lock:
            self._abandoned = not self._committing
            return self._abandoned


# The request call a store thread is running; None for background work.
_running: ContextVar[_RequestCall | None] = ContextVar("nmt_store_request_call", default=None)


def may_commit() -> bool:
    """Whether the write on this thread may commit: always, unless it runs for a request that
    has already been answered (StoreUnavailable, its time out)."""
    call = _running.get()
    return call is None or call.begin_commit()


def _run_for(request_call: _RequestCall, call: Callable[..., T], *args: Any) -> T:
    token = _running.set(request_call)
    try:
        return call(*args)
    finally:
        _running.reset(token)


class StoreThreads:
    def __init__(self, timeout_seconds: float, threads: int = STORE_THREADS) -> None:
        self.timeout_seconds = timeout_seconds
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="nmt-store")

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        """call(*args) on a store thread, for a request: StoreUnavailable past the timeout,
        and then whatever the call was writing is not committed."""
        request_call = _RequestCall()
        future = asyncio.get_running_loop().run_in_executor(
            self._executor, _run_for, request_call, call, *args
        )
        try:
            done, _ = await asyncio.wait({future}, timeout=self.timeout_seconds)
        except asyncio.CancelledError:  # the request's task (asyncio.wait does not cancel it)
            future.cancel()  # dropped if not started yet
            raise
        if done:
            return future.result()
        if request_call.abandon():
            future.cancel()  # dropped if not started yet; else it rolls back when it can
            raise StoreUnavailable(f"the database did not answer within {self.timeout_seconds:g} s")
        # Its commit was sent: what it did is the database's answer, which comes once more.
        done, _ = await asyncio.wait({future}, timeout=self.timeout_seconds)
        if done:
            return future.result()
        raise StoreUnavailable(
            "the database did not confirm a change within "
            f"{2 * self.timeout_seconds:g} s: it may have been made"
        )

    async def run_unbounded(self, call: Callable[..., T], *args: Any) -> T:
        """call(*args) on a store thread, waiting as long as it takes (background work)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, call, *args)

    def close(self) -> None:
        """Calls still queued are dropped; running ones are not waited for."""
        self._executor.shutdown(wait=False, cancel_futures=True)
