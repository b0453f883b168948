"""Prometheus metrics (prefix `nmt_`), in one registry per app.

They are chosen so that batching is visible from outside: how long sentences wait in the queue,
how large the batches are (sentences and tokens), how long a batch takes and how many decoder
steps it ran. A registry per app (not the process-wide default) lets tests build several apps.

The scheduler reports through the `observe_*` methods (it never imports prometheus_client);
the HTTP middleware reports requests.
"""

from __future__ import annotations

import platform
from importlib import metadata

import onnxruntime
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SENTENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def package_version() -> str:
    try:
        return metadata.version("nmt-serve")
    except metadata.PackageNotFoundError:
        return "unknown"


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "nmt_requests",
            "HTTP requests answered, by route template, model and status code",
            ["route", "model", "status"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "nmt_request_duration_seconds",
            "time from receiving a request to sending its answer",
            ["route", "model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.requests_in_progress = Gauge(
            "nmt_requests_in_progress", "HTTP requests being handled now", registry=registry
        )
        self.queue_depth = Gauge(
            "nmt_queue_depth", "sentences waiting for a batch", ["model"], registry=registry
        )
        self.queue_capacity = Gauge(
            "nmt_queue_capacity",
            "sentences the queue may hold (NMT_MAX_QUEUE_SENTENCES); past it, 429",
            ["model"],
            registry=registry,
        )
        self.queue_wait = Histogram(
            "nmt_queue_wait_seconds",
            "time a sentence waited in the queue before its batch started",
            ["model"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.batch_sentences = Histogram(
            "nmt_batch_sentences",
            "sentences in one engine batch",
            ["model"],
            buckets=SENTENCE_BUCKETS,
            registry=registry,
        )
        self.batch_tokens = Histogram(
            "nmt_batch_tokens",
            "source tokens in one engine batch",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.batch_duration = Histogram(
            "nmt_batch_duration_seconds",
            "engine time of one batch (encode and search)",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.input_tokens = Counter(
            "nmt_input_tokens", "source tokens translated", ["model"], registry=registry
        )
        self.output_tokens = Counter(
            "nmt_output_tokens",
            "target tokens produced (best hypothesis, without </s>)",
            ["model"],
            registry=registry,
        )
        self.decode_steps = Counter(
            "nmt_decode_steps",
            "decoder steps run (per batch: its longest output, </s> included)",
            ["model"],
            registry=registry,
        )
        self.batch_failures = Counter(
            "nmt_batch_failures",
            "engine batches that failed (their sentences are then retried one by one)",
            ["model"],
            registry=registry,
        )
        self.dropped_sentences = Counter(
            "nmt_dropped_sentences",
            "queued sentences dropped before translation, by reason",
            ["model", "reason"],
            registry=registry,
        )
        self.cache_lookups = Counter(
            "nmt_cache_lookups",
            "sentence lookups in the translation cache, by result (hit or miss)",
            ["model", "result"],
            registry=registry,
        )
        self.cache_evictions = Counter(
            "nmt_cache_evictions",
            "sentences evicted from the translation cache to stay within its bounds",
            ["model"],
            registry=registry,
        )
        self.model_load = Gauge(
            "nmt_model_load_seconds",
            "time to load and warm up a model",
            ["model"],
            registry=registry,
        )
        Info("nmt_build", "versions of the service and its runtime", registry=registry).info(
            {
                "version": package_version(),
                "onnxruntime": onnxruntime.__version__,
                "python": platform.python_version(),
            }
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # The scheduler's observer interface (see scheduler.BatchObserver).
    def observe_queue_depth(self, model: str, depth: int) -> None:
        self.queue_depth.labels(model).set(depth)

    def observe_batch(
        self,
        model: str,
        waits: list[float],
        input_tokens: int,
        output_tokens: int,
        steps: int,
        seconds: float,
    ) -> None:
        for wait in waits:
            self.queue_wait.labels(model).observe(wait)
        self.batch_sentences.labels(model).observe(len(waits))
        self.batch_tokens.labels(model).observe(input_tokens)
        self.batch_duration.labels(model).observe(seconds)
        self.input_tokens.labels(model).inc(input_tokens)
        self.output_tokens.labels(model).inc(output_tokens)
        self.decode_steps.labels(model).inc(steps)

    def observe_batch_failure(self, model: str) -> None:
        self.batch_failures.labels(model).inc()

    def observe_dropped(self, model: str, reason: str, count: int) -> None:
        if count:
            self.dropped_sentences.labels(model, reason).inc(count)

    # Requests (the HTTP middleware) and models (the registry).
    def observe_request(self, route: str, model: str, status: int, seconds: float) -> None:
        self.requests.labels(route, model, str(status)).inc()
        self.request_duration.labels(route, model).observe(seconds)

    def observe_cache(self, model: str, hits: int, misses: int, evictions: int) -> None:
        if hits:
            self.cache_lookups.labels(model, "hit").inc(hits)
        if misses:
            self.cache_lookups.labels(model, "miss").inc(misses)
        if evictions:
            self.cache_evictions.labels(model).inc(evictions)

    def observe_model_loaded(self, model: str, seconds: float, queue_capacity: int) -> None:
        self.model_load.labels(model).set(seconds)
        self.queue_capacity.labels(model).set(queue_capacity)
