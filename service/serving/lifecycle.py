"""The server's phase, as /healthz, /readyz and the translation routes see it.

starting -> ready -> draining, or starting -> failed. Alive (healthz) unless failed; ready
(readyz) only when every model is loaded and warmed up and no SIGTERM has come. A load balancer
stops sending traffic on a 503 from /readyz, which is what draining wants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from service.serving.errors import NotReady, ShuttingDown

Phase = Literal["starting", "ready", "draining", "failed"]


class Lifecycle:
    def __init__(self, on_failed: Callable[[str], None] | None = None) -> None:
        self.phase: Phase = "starting"
        self.reason = "loading models"
        self._on_failed = on_failed

    def mark_ready(self) -> None:
        if self.phase == "starting":
            self.phase, self.reason = "ready", "ready"

    def mark_failed(self, reason: str) -> None:
        self.phase, self.reason = "failed", reason
        if self._on_failed:
            self._on_failed(reason)

    def start_draining(self) -> None:
        if self.phase != "failed":
            self.phase, self.reason = "draining", "shutting down: finishing admitted requests"

    @property
    def alive(self) -> bool:
        return self.phase != "failed"

    @property
    def ready(self) -> bool:
        return self.phase == "ready"

    def check_accepting(self) -> None:
        """Raise unless new translation work may be admitted."""
        if self.phase == "draining":
            raise ShuttingDown(self.reason)
        if self.phase != "ready":
            raise NotReady(
                self.reason if self.phase == "failed" else "models are loading: retry shortly"
            )
