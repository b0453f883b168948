"""Prometheus metrics (prefix `nmt_`), in one registry per app.

They are chosen so that batching is visible from outside: how long sentences wait in the queue,
how large the batches are (sentences and tokens), how long a batch or a step takes, how many
decoder steps ran, and with continuous batching how full the running batch is at each step and
who joins and leaves it. A registry per app (not the process-wide default) lets tests build
several apps.

The decoding loop reports through the `observe_*` methods (it never imports prometheus_client);
the HTTP middleware reports requests.

Continuous batching reports every decoder step, so `observe_step` only appends to a buffer,
and the buffered steps go into their metrics when the registry is collected (a scrape of
/metrics) or every STEP_BUFFER steps. Why: the worker thread runs that Python right after an
ONNX Runtime call, with the interpreter's code and data out of the CPU's caches, and the six
Prometheus calls of a step took about 25 µs there, against 7.5 in a loop (`python -m
bench.scheduler_overhead`; docs/service.md, "The scheduler's own work a step"): about 1.5%
of a lone greedy request. Appending to a deque takes about a microsecond.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
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
from prometheus_client.registry import Collector

from service.serving.observer import ModelLabels

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SENTENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)

# Decoder steps buffered before the worker puts them into their metrics itself (when nobody
# scrapes): about 1 ms of its time every 256 steps, instead of 25 µs at each.
STEP_BUFFER = 256

# How long a scrape waits for a count from the database (nmt_glossaries). /metrics renders on
# the event loop: a database that hangs must not hang the health checks with it.
COUNT_WAIT_SECONDS = 0.5

log = logging.getLogger("nmt.metrics")


def package_version() -> str:
    try:
        return metadata.version("nmt-serve")
    except metadata.PackageNotFoundError:
        return "unknown"


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self._step_metrics: dict[ModelLabels, tuple] = {}  # see _per_step
        # (model, sentences, reserved tokens, output tokens, seconds) of steps not yet put
        # into their metrics; appended by the worker threads, emptied by flush_steps.
        self._steps: deque[tuple[ModelLabels, int, int, int, float]] = deque()
        self._flushing = threading.Lock()
        # Registered first, so that every collection (a scrape, a test reading a sample)
        # flushes the buffered steps before the metrics are read.
        registry.register(_FlushSteps(self))
        self.requests = Counter(
            "nmt_requests",
            "HTTP requests answered, by route template, model and status code",
            ["route", "model", "version", "status"],
            registry=registry,
        )
        self.glossary_terms_kept = Histogram(
            "nmt_glossary_terms_kept_ratio",
            "per request with glossary terms: the share of the terms found in its sentences "
            "that their translations contain",
            ["model", "version"],
            buckets=(0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0),
            registry=registry,
        )
        self.translation_confidence = Histogram(
            "nmt_translation_confidence",
            "per translated sentence whose confidence was asked for (return_confidence), its "
            "calibrated confidence: a falling median means the traffic left what the model "
            "knows (alert NmtConfidenceDropped)",
            ["model", "version"],
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0),
            registry=registry,
        )
        self.request_duration = Histogram(
            "nmt_request_duration_seconds",
            "time from receiving a request to sending its answer",
            ["route", "model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.requests_in_progress = Gauge(
            "nmt_requests_in_progress", "HTTP requests being handled now", registry=registry
        )
        self.connections_refused = Counter(
            "nmt_connections_refused",
            "connections closed or requests refused before they reached a route, by reason: "
            "header_timeout, header_too_large, client_cap",
            ["reason"],
            registry=registry,
        )
        self.queue_depth = Gauge(
            "nmt_queue_depth",
            "sentences waiting for a batch",
            ["model", "version"],
            registry=registry,
        )
        self.queue_capacity = Gauge(
            "nmt_queue_capacity",
            "sentences the queue may hold (NMT_MAX_QUEUE_SENTENCES); past it, 429",
            ["model", "version"],
            registry=registry,
        )
        self.capacity = Gauge(
            "nmt_capacity_sentences_per_second",
            "queued sentences the model took into its batches per second while others waited "
            "(its measured capacity; admission forecasts queue waits from it)",
            ["model", "version"],
            registry=registry,
        )
        self.queue_wait = Histogram(
            "nmt_queue_wait_seconds",
            "time a sentence waited in the queue before it joined the running batch",
            ["model", "version"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.input_tokens = Counter(
            "nmt_input_tokens", "source tokens translated", ["model", "version"], registry=registry
        )
        self.output_tokens = Counter(
            "nmt_output_tokens",
            "target tokens produced (best hypothesis, without </s>)",
            ["model", "version"],
            registry=registry,
        )
        self.decode_steps = Counter(
            "nmt_decode_steps",
            "decoder steps run",
            ["model", "version"],
            registry=registry,
        )
        # Continuous batching (names after TGI's where it has one: tgi_batch_current_size,
        # tgi_batch_current_max_tokens, tgi_batch_forward_duration, tgi_request_*_duration).
        self.batch_current_size = Gauge(
            "nmt_batch_current_size",
            "sentences in the running batches (continuous batching), at the scrape",
            ["model", "version"],
            registry=registry,
        )
        self.batch_current_max_tokens = Gauge(
            "nmt_batch_current_max_tokens",
            "tokens the running batches have reserved, at the scrape: sources plus the "
            "caches their rows may grow to (bounded by NMT_MAX_BATCH_TOTAL_TOKENS a batch)",
            ["model", "version"],
            registry=registry,
        )
        self.step_sentences = Histogram(
            "nmt_batch_step_sentences",
            "sentences in the running batch at one decoder step (its occupancy)",
            ["model", "version"],
            buckets=SENTENCE_BUCKETS,
            registry=registry,
        )
        self.forward_duration = Histogram(
            "nmt_batch_forward_duration_seconds",
            "engine time of one join (method=prefill: encode and merge) or one decoder step "
            "(method=decode)",
            ["model", "version", "method"],
            buckets=STEP_BUCKETS,
            registry=registry,
        )
        self.joined = Counter(
            "nmt_batch_joined_sentences",
            "sentences that joined the running batch",
            ["model", "version"],
            registry=registry,
        )
        self.left = Counter(
            "nmt_batch_left_sentences",
            "sentences that left the running batch, by reason (finished, abandoned, failed)",
            ["model", "version", "reason"],
            registry=registry,
        )
        self.request_queue = Histogram(
            "nmt_request_queue_duration_seconds",
            "per translation job: from arrival until its first sentence reached the engine",
            ["model", "version"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.request_inference = Histogram(
            "nmt_request_inference_duration_seconds",
            "per translation job: from its first sentence reaching the engine to its last "
            "sentence's end",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.time_per_token = Histogram(
            "nmt_request_mean_time_per_token_duration_seconds",
            "per translation job: inference time divided by the tokens it produced",
            ["model", "version"],
            buckets=STEP_BUCKETS,
            registry=registry,
        )
        self.batch_failures = Counter(
            "nmt_batch_failures",
            "engine batches that failed (their sentences are then retried one by one)",
            ["model", "version"],
            registry=registry,
        )
        self.dropped_sentences = Counter(
            "nmt_dropped_sentences",
            "queued sentences dropped before translation, by reason",
            ["model", "version", "reason"],
            registry=registry,
        )
        self.cache_lookups = Counter(
            "nmt_cache_lookups",
            "sentence lookups in the translation cache, by result (hit or miss)",
            ["model", "version", "result"],
            registry=registry,
        )
        self.cache_evictions = Counter(
            "nmt_cache_evictions",
            "sentences evicted from the translation cache to stay within its bounds",
            ["model", "version"],
            registry=registry,
        )
        self.model_load = Gauge(
            "nmt_model_load_seconds",
            "time to load and warm up a model",
            ["model", "version"],
            registry=registry,
        )
        self.model_loads = Counter(
            "nmt_model_loads",
            "attempts to load a model version, by outcome (loaded, failed: it did not load or "
            "warm up, and what served before serves on)",
            ["model", "version", "outcome"],
            registry=registry,
        )
        # Read from the store at each scrape (watch_glossaries): the database is the truth,
        # shared by every replica, so each reports the same number.
        self.glossaries = Gauge(
            "nmt_glossaries",
            "glossaries in the store, of every owner (read from the database at each scrape)",
            registry=registry,
        )
        self.glossaries.set_function(lambda: float("nan"))  # no store attached
        self.documents_queued = Gauge(
            "nmt_documents_queued",
            "document jobs waiting for a worker, of every replica (read from the database at "
            "each scrape)",
            registry=registry,
        )
        self.documents_queued.set_function(lambda: float("nan"))
        self.documents = Counter(
            "nmt_documents_total",
            "document jobs this server's workers ended, by format and outcome (done, error)",
            ["format", "outcome"],
            registry=registry,
        )
        self.document_characters = Counter(
            "nmt_document_characters_total",
            "characters of documents this server's workers translated",
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

    # What the decoding loop reports (observer.BatchObserver).
    def observe_queue_depth(self, model: ModelLabels, depth: int) -> None:
        self.queue_depth.labels(*model).set(depth)

    def observe_join(
        self, model: ModelLabels, waits: list[float], input_tokens: int, seconds: float
    ) -> None:
        for wait in waits:
            self.queue_wait.labels(*model).observe(wait)
        self.joined.labels(*model).inc(len(waits))
        self.input_tokens.labels(*model).inc(input_tokens)
        self.forward_duration.labels(*model, "prefill").observe(seconds)

    def observe_step(
        self,
        model: ModelLabels,
        sentences: int,
        rows: int,
        output_tokens: int,
        seconds: float,
    ) -> None:
        self._steps.append((model, sentences, output_tokens, seconds))
        if len(self._steps) >= STEP_BUFFER:
            self.flush_steps(wait=False)

    def flush_steps(self, wait: bool = True) -> None:
        """Put the buffered steps into their metrics, in order. One flush at a time;
        `wait=False` (the worker) leaves it to a flush already under way. The histograms take
        every step; the counters take each model's sums, once a flush (each update takes a
        lock: with six updates a step, buffering and flushing took the worker 4.5 µs a step;
        with two, 3.0; on an AMD EPYC with AVX2)."""
        if not self._flushing.acquire(blocking=wait):
            return
        try:
            counted: dict[ModelLabels, list[int]] = {}  # model -> [steps, output tokens]
            while self._steps:
                model, sentences, output_tokens, seconds = self._steps.popleft()
                step_sentences, duration, _, _ = self._per_step(model)
                step_sentences.observe(sentences)
                duration.observe(seconds)
                count = counted.setdefault(model, [0, 0])
                count[0] += 1
                count[1] += output_tokens
            for model, (steps, output_tokens) in counted.items():
                _, _, tokens, decode_steps = self._per_step(model)
                if output_tokens:
                    tokens.inc(output_tokens)
                decode_steps.inc(steps)
        finally:
            self._flushing.release()

    def _per_step(self, model: ModelLabels) -> tuple:
        """A step's labelled metrics for `model`, looked up once: six `labels()` lookups a
        step took about as long as the rest of the scheduler's own work a step."""
        found = self._step_metrics.get(model)
        if found is None:
            found = self._step_metrics[model] = (
                self.step_sentences.labels(*model),
                self.forward_duration.labels(*model, "decode"),
                self.output_tokens.labels(*model),
                self.decode_steps.labels(*model),
            )
        return found

    def observe_left(self, model: ModelLabels, reason: str, count: int) -> None:
        if count:
            self.left.labels(*model, reason).inc(count)

    def observe_job(
        self, model: ModelLabels, queued: float, inference: float, output_tokens: int
    ) -> None:
        self.request_queue.labels(*model).observe(queued)
        self.request_inference.labels(*model).observe(inference)
        if output_tokens:
            self.time_per_token.labels(*model).observe(inference / output_tokens)

    def observe_batch_failure(self, model: ModelLabels) -> None:
        self.batch_failures.labels(*model).inc()

    def observe_dropped(self, model: ModelLabels, reason: str, count: int) -> None:
        if count:
            self.dropped_sentences.labels(*model, reason).inc(count)

    def observe_capacity(self, model: ModelLabels, sentences_per_second: float) -> None:
        self.capacity.labels(*model).set(sentences_per_second)

    # Requests (the HTTP middleware) and models (the registry).
    def observe_terms_kept(self, model: ModelLabels, ratio: float) -> None:
        self.glossary_terms_kept.labels(*model).observe(ratio)

    def observe_confidence(self, model: ModelLabels, confidences: list[float]) -> None:
        histogram = self.translation_confidence.labels(*model)
        for confidence in confidences:
            histogram.observe(confidence)

    def observe_request(self, route: str, model: ModelLabels, status: int, seconds: float) -> None:
        self.requests.labels(route, *model, str(status)).inc()
        self.request_duration.labels(route, *model).observe(seconds)

    def observe_cache(self, model: ModelLabels, hits: int, misses: int, evictions: int) -> None:
        if hits:
            self.cache_lookups.labels(*model, "hit").inc(hits)
        if misses:
            self.cache_lookups.labels(*model, "miss").inc(misses)
        if evictions:
            self.cache_evictions.labels(*model).inc(evictions)

    def watch_glossaries(self, count: Callable[[], int]) -> None:
        """nmt_glossaries becomes `count()` (the store's) at each scrape, read off the event
        loop (/metrics renders on it) and waited for at most COUNT_WAIT_SECONDS."""
        self.glossaries.set_function(_BoundedRead(count, "nmt_glossaries"))

    def watch_documents(self, queued: Callable[[], int]) -> None:
        """nmt_documents_queued becomes `queued()` (the store's) at each scrape."""
        self.documents_queued.set_function(_BoundedRead(queued, "nmt_documents_queued"))

    def observe_document(self, format: str, outcome: str, characters: int) -> None:
        self.documents.labels(format, outcome).inc()
        if outcome == "done":
            self.document_characters.inc(characters)

    def forget_model(self, model: ModelLabels) -> None:
        """An unloaded version's gauges go (counters and histograms stay: rates need them):
        a gauge left at its last value would count in every sum by model."""
        self.flush_steps()
        self._step_metrics.pop(model, None)
        for gauge in (
            self.queue_depth,
            self.queue_capacity,
            self.capacity,
            self.batch_current_size,
            self.batch_current_max_tokens,
            self.model_load,
        ):
            with contextlib.suppress(KeyError):  # never set for this version
                gauge.remove(*model)

    def observe_model_load(self, model: str, version: str, outcome: str) -> None:
        self.model_loads.labels(model, version, outcome).inc()

    def observe_model_loaded(self, model: ModelLabels, seconds: float, queue_capacity: int) -> None:
        self.model_load.labels(*model).set(seconds)
        self.queue_capacity.labels(*model).set(queue_capacity)

    def watch_batches(
        self, model: ModelLabels, sentences: Callable[[], int], tokens: Callable[[], int]
    ) -> None:
        """nmt_batch_current_size and _max_tokens of `model` become `sentences()` and
        `tokens()` (its decoding loop's running batches) at each scrape: what runs now, 0
        when idle, not what ran at the last step before."""
        self.batch_current_size.labels(*model).set_function(sentences)
        self.batch_current_max_tokens.labels(*model).set_function(tokens)


class _FlushSteps(Collector):
    """Collects nothing: flushes the buffered decoder steps (Metrics.flush_steps) before the
    registry collects the metrics they go into."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator:
        self._metrics.flush_steps()
        return iter(())

    def describe(self) -> Iterator:
        return iter(())


class _BoundedRead:
    """A gauge's callback that calls `read` on a thread of its own and waits for it at most
    COUNT_WAIT_SECONDS: the value, or NaN when it failed or is late. While a late read runs,
    scrapes neither wait for it nor start another (a database that hangs gets one query at a
    time); a failure is logged once, until a read succeeds again."""

    def __init__(self, read: Callable[[], int], name: str) -> None:
        self._read, self._name = read, name
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"nmt-{name}")
        self._pending: Future[int] | None = None
        self._failing = False

    def __call__(self) -> float:
        if self._pending is not None and not self._pending.done():
            self._report("the last read has not answered yet")
            return float("nan")  # and no second wait for it
        self._pending = self._executor.submit(self._read)
        try:
            value = float(self._pending.result(timeout=COUNT_WAIT_SECONDS))
        except FutureTimeout:
            self._report(f"no answer within {COUNT_WAIT_SECONDS} s")
            return float("nan")
        except Exception as error:
            self._report(str(error))
            return float("nan")
        self._failing = False
        return value

    def _report(self, reason: str) -> None:
        if not self._failing:
            log.warning("%s: could not read it: %s", self._name, reason)
        self._failing = True
