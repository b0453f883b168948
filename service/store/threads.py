"""The threads the store's calls run on: how the event loop reaches a synchronous store.

A pool of its own, not asyncio's default one. A database that hangs (a server frozen, a table
locked by a migration or an operator) holds a thread for as long as it does not answer. In the
default pool such calls would take the threads that parse and prepare translations, which need
no database: a frozen PostgreSQL once held a plain translation for 30 s. Here they hold the
store's threads only.

A request waits for its call at most NMT_DATABASE_TIMEOUT_SECONDS and then gets StoreUnavailable
(a 503 to retry): a call not started yet is dropped; one already running cannot be stopped and
finishes on its thread when the database answers (a write then lands after its request was
refused, as it would for a client that gave up). Background work (the document workers) waits
as long as the call takes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from service.store.errors import StoreUnavailable

T = TypeVar("T")

# Store calls running at once: above the few the document workers hold (a claim, a lease
# renewal, a chunk saved), and below the connection pool's limit (SQLAlchemy's 5 + 10
# overflow), so that a thread that runs always gets a connection without waiting for one.
STORE_THREADS = 8


class StoreThreads:
    def __init__(self, timeout_seconds: float, threads: int = STORE_THREADS) -> None:
        self.timeout_seconds = timeout_seconds
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="nmt-store")

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        """call(*args) on a store thread, for a request: StoreUnavailable past the timeout."""
        future = asyncio.get_running_loop().run_in_executor(self._executor, call, *args)
        try:
            return await asyncio.wait_for(future, self.timeout_seconds)
        except TimeoutError:
            raise StoreUnavailable(
                f"the database did not answer within {self.timeout_seconds:g} s"
            ) from None

    async def run_unbounded(self, call: Callable[..., T], *args: Any) -> T:
        """call(*args) on a store thread, waiting as long as it takes (background work)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, call, *args)

    def close(self) -> None:
        """Calls still queued are dropped; running ones are not waited for."""
        self._executor.shutdown(wait=False, cancel_futures=True)
