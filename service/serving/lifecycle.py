"""The server's phase, as /healthz, /readyz and the translation routes see it.

starting -> ready -> draining, or starting -> failed. Alive (healthz) unless failed; ready
(readyz) only when every model is loaded and warmed up and no SIGTERM has come. A load balancer
stops sending traffic on a 503 from /readyz, which is what draining wants.

Draining lasts `grace` seconds (NMT_SHUTDOWN_TIMEOUT_SECONDS): then `grace_over` is set, and
requests still waiting give up with a 503 that says so (counted in `abandoned`), rather than
being cut off by the server with no answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Literal

from service.serving.errors import NotReady, ShuttingDown

Phase = Literal["starting", "ready", "draining", "failed"]


class Lifecycle:
    def __init__(self, on_failed: Callable[[str], None] | None = None, grace: float = 30.0) -> None:
        self.phase: Phase = "starting"
        self.reason = "loading models"
        self.grace = grace
        self.grace_over = asyncio.Event()  # bound to the serving loop on first use
        self.abandoned = 0  # admitted requests answered 503 when the grace ran out
        self.draining_since: float | None = None  # time.monotonic() of the signal
        self._on_failed = on_failed

    def mark_ready(self) -> None:
        if self.phase == "starting":
            self.phase, self.reason = "ready", "ready"

    def mark_failed(self, reason: str) -> None:
        self.phase, self.reason = "failed", reason
        if self._on_failed:
            self._on_failed(reason)

    def start_draining(self) -> None:
        """Called on the event loop's thread (from the signal handler or the lifespan)."""
        if self.phase in ("failed", "draining"):
            return
        self.phase, self.reason = "draining", "shutting down: finishing admitted requests"
        self.draining_since = time.monotonic()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a test, or the loop already gone): nothing waits
            return
        # call_soon_threadsafe: safe from a signal handler, which may interrupt the loop.
        loop.call_soon_threadsafe(loop.call_later, self.grace, self.grace_over.set)

    @property
    def alive(self) -> bool:
        return self.phase != "failed"

    @property
    def ready(self) -> bool:
        return self.phase == "ready"

    def check_accepting(self, admitted_at: float | None = None) -> None:
        """Raise unless new translation work may be admitted. A request the server admitted
        (time.monotonic() `admitted_at`) before the signal is finished, even if its handler
        only gets here after it: draining refuses newcomers, not what it promised to finish."""
        if self.phase == "draining":
            assert self.draining_since is not None
            if admitted_at is not None and admitted_at < self.draining_since:
                return
            raise ShuttingDown(self.reason)
        if self.phase != "ready":
            raise NotReady(
                self.reason if self.phase == "failed" else "models are loading: retry shortly"
            )
