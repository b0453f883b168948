"""What the decoding loop reports as it runs, for whoever watches it: the server's metrics
(metrics.Metrics implements it) or a benchmark's probe, with nothing patched into the loop.
Most reports come from the loop's worker thread, between two decoder steps, and the queue
depth and dropped sentences from the event loop too (submit, cancel): an observer must be
quick and thread-safe."""

from __future__ import annotations

from typing import Protocol


class BatchObserver(Protocol):
    def observe_queue_depth(self, model: str, depth: int) -> None: ...

    def observe_batch_failure(self, model: str) -> None: ...

    def observe_step(
        self,
        model: str,
        sentences: int,
        rows: int,
        reserved_tokens: int,
        output_tokens: int,
        seconds: float,
    ) -> None: ...

    def observe_join(
        self, model: str, waits: list[float], input_tokens: int, seconds: float
    ) -> None: ...

    def observe_left(self, model: str, reason: str, count: int) -> None: ...

    def observe_job(
        self, model: str, queued: float, inference: float, output_tokens: int
    ) -> None: ...

    def observe_dropped(self, model: str, reason: str, count: int) -> None: ...

    def observe_capacity(self, model: str, sentences_per_second: float) -> None: ...
