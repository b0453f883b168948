"""What the decoding loop reports as it runs, for whoever watches it: the server's metrics
(metrics.Metrics implements it) or a benchmark's probe, with nothing patched into the loop.
Most reports come from the loop's worker thread, between two decoder steps, and the queue
depth and dropped sentences from the event loop too (submit, cancel): an observer must be
quick and thread-safe."""

from __future__ import annotations

from typing import Protocol

# A model's metric labels: its name and version ("" for an unversioned bundle).
ModelLabels = tuple[str, str]


class BatchObserver(Protocol):
    def observe_queue_depth(self, model: ModelLabels, depth: int) -> None: ...

    def observe_batch_failure(self, model: ModelLabels) -> None: ...

    def observe_step(
        self,
        model: ModelLabels,
        sentences: int,
        rows: int,
        output_tokens: int,
        seconds: float,
    ) -> None: ...

    def observe_join(
        self, model: ModelLabels, waits: list[float], input_tokens: int, seconds: float
    ) -> None: ...

    def observe_left(self, model: ModelLabels, reason: str, count: int) -> None: ...

    def observe_job(
        self, model: ModelLabels, queued: float, inference: float, output_tokens: int
    ) -> None: ...

    def observe_dropped(self, model: ModelLabels, reason: str, count: int) -> None: ...

    def observe_capacity(self, model: ModelLabels, sentences_per_second: float) -> None: ...
