"""Traces of translation requests (OpenTelemetry), sent over OTLP/HTTP when an endpoint is set:
NMT_OTLP_ENDPOINT, or OpenTelemetry's own OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
OTEL_EXPORTER_OTLP_ENDPOINT. With none, tracing is off and free: the SDK is never imported, no
job carries a trace, and the decoding loop's only cost is a test for None where a sentence is
encoded, joins or ends (never at a decoder step).

A request's span is made by the HTTP layer (FastAPI's instrumentation). Under it:

    nmt.prepare   clean, split and tokenize the texts
    nmt.queue     from submission until its sentences joined a running batch (one per join)
    nmt.encode    an encoder call that encoded some of its sentences (ahead, or at the join)
    nmt.decode    one sentence, from its join to its end; its decoder steps and tokens are
                  counts (a span per step would cost more than the loop's own work a step)
    nmt.assemble  detokenize, rejoin, alignment

each with the model's name and version (`nmt.model`, `nmt.model.version`), which the request's
span gets too. The decoding loop runs on threads of its own, between two decoder steps of
everybody's sentences, so it makes no span: it writes down, in the job's `JobTrace`, times it
reads anyway, and the spans are made from them on the event loop once the job is over, as
children of the context captured when the job was submitted.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

    from service.serving.registry import LoadedModel
    from service.serving.settings import Settings

log = logging.getLogger("nmt.tracing")

TRACES_PATH = "/v1/traces"  # OTLP/HTTP's path for spans, after a collector's base URL
_OFF: AbstractContextManager[None] = nullcontext()


def traces_endpoint(setting: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The URL spans are posted to, or None: tracing off. NMT_OTLP_ENDPOINT is a collector's
    base URL (as OTEL_EXPORTER_OTLP_ENDPOINT is: /v1/traces is added) or already a traces
    URL; without it, OpenTelemetry's own variables, as its exporters read them.
    OTEL_SDK_DISABLED=true turns tracing off whatever is set."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if setting.strip():
        return _with_traces_path(setting.strip())
    if traces := environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip():
        return traces
    if base := environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip():
        return _with_traces_path(base)
    return None


def _with_traces_path(url: str) -> str:
    return url if url.rstrip("/").endswith(TRACES_PATH) else url.rstrip("/") + TRACES_PATH


def new_provider() -> TracerProvider:
    """An SDK tracer provider naming this service (OTEL_SERVICE_NAME and
    OTEL_RESOURCE_ATTRIBUTES still apply), with no exporter yet. Sampling follows
    OTEL_TRACES_SAMPLER (default: every request, or as its caller's trace says)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    attributes = {"service.version": _version()}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "nmt-serve"
    return TracerProvider(resource=Resource.create(attributes))


def _version() -> str:
    try:
        return metadata.version("nmt-serve")
    except metadata.PackageNotFoundError:
        return "unknown"


def model_attributes(model: LoadedModel) -> dict[str, Any]:
    """A model's name, and its version where the registry knows one."""
    attributes: dict[str, Any] = {"nmt.model": model.name}
    version = getattr(model, "version", None)  # a versioned repository's models have one
    if version is not None:
        attributes["nmt.model.version"] = str(version)
    return attributes


class Tracing:
    """The service's tracer, or none (the default: tracing off). Injected, not global: the
    provider is not installed as OpenTelemetry's global one, so an app, or a test, has its
    own."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self._tracer: Tracer | None = None
        if provider is not None:
            from opentelemetry import trace

            self._trace = trace
            self._tracer = provider.get_tracer("nmt-serve", _version())

    @classmethod
    def from_settings(cls, settings: Settings) -> Tracing:
        """Spans batched and posted over OTLP/HTTP to the configured endpoint; off without one."""
        endpoint = traces_endpoint(settings.otlp_endpoint)
        if endpoint is None:
            return cls()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = new_provider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        log.info("traces go to %s", endpoint)
        return cls(provider)

    @property
    def on(self) -> bool:
        return self._tracer is not None

    def span(self, name: str, model: LoadedModel) -> AbstractContextManager[Any]:
        """A span under the current one (the request's), for work on the event loop or awaited
        there; nothing when tracing is off or the request is not traced (not sampled, or no
        request at all: a document's chunks)."""
        if self._tracer is None or not self._trace.get_current_span().is_recording():
            return _OFF
        return self._tracer.start_as_current_span(name, attributes=model_attributes(model))

    def job(self, model: LoadedModel, sentences: int, beam_size: int) -> JobTrace | None:
        """On the event loop, as a job is submitted: a record for the decoding loop to fill,
        whose parent is the current span, or None when there is nothing to trace. The
        request's span gets the model's attributes."""
        if self._tracer is None:
            return None
        current = self._trace.get_current_span()
        if not current.is_recording():
            return None
        attributes = model_attributes(model)
        current.set_attributes(attributes)
        attributes["nmt.beam_size"] = beam_size
        context = self._trace.set_span_in_context(current)
        return JobTrace(self._tracer, context, attributes, sentences)

    def shutdown(self) -> None:
        """Send the spans still buffered (at the server's stop)."""
        if self.provider is not None:
            self.provider.shutdown()


class JobTrace:
    """One traced job's times, on the decoding loop's clock, per sentence (its index in the
    job). The loop's threads write them as its sentences move (each slot once, by one thread,
    before the job's future resolves); `end` makes the spans from them."""

    __slots__ = (
        "_attributes",
        "_parent",
        "_tracer",
        "_wall_ns",
        "encodes",
        "ends",
        "joins",
        "submitted",
    )

    def __init__(
        self, tracer: Tracer, parent: Context, attributes: dict[str, Any], sentences: int
    ) -> None:
        self._tracer, self._parent, self._attributes = tracer, parent, attributes
        self.submitted: float | None = None
        self._wall_ns = 0
        # Lists of a fixed length, written by index: read from the event loop, safely, even
        # while a cancelled job's sentence is still being written down by the worker.
        self.encodes: list[tuple[float, float, int] | None] = [None] * sentences
        self.joins: list[tuple[float, float, int] | None] = [None] * sentences
        self.ends: list[tuple[float, int, int] | None] = [None] * sentences

    def start(self, now: float) -> None:
        """The loop queues the job at `now`: the loop's clock is tied to the wall clock here."""
        self.submitted, self._wall_ns = now, time.time_ns()

    def encoded(self, index: int, start: float, end: float, call_sentences: int) -> None:
        """Sentence `index` was encoded in one encoder call of `call_sentences` sentences."""
        self.encodes[index] = (start, end, call_sentences)

    def joined(self, index: int, start: float, end: float, source_tokens: int) -> None:
        """Sentence `index` joined a running batch: the join began at `start` (its queue wait
        ends) and decoding begins at `end`."""
        self.joins[index] = (start, end, source_tokens)

    def finished(self, index: int, now: float, steps: int, output_tokens: int) -> None:
        self.ends[index] = (now, steps, output_tokens)

    def end(self, future: asyncio.Future) -> None:
        """The job's spans, once its future is done (its done callback: on the event loop).
        Sentences that never joined or never ended (a deadline, a client gone, a failure)
        get spans that end now, with the job's error."""
        if self.submitted is None:  # never queued
            return
        error = _error_of(future)
        now_ns = time.time_ns()
        queued = Counter(join[0] for join in self.joins if join is not None)
        for start, count in queued.items():
            self._span("nmt.queue", self.submitted, self._ns(start), {"nmt.sentences": count})
        pairs = zip(self.joins, self.ends, strict=True)
        waiting = sum(1 for join, ended in pairs if join is None and ended is None)
        if waiting:
            self._span("nmt.queue", self.submitted, now_ns, {"nmt.sentences": waiting}, error)
        calls = Counter(encode for encode in self.encodes if encode is not None)
        for (start, end, call_sentences), count in calls.items():
            attributes = {"nmt.sentences": count, "nmt.encoder.sentences": call_sentences}
            self._span("nmt.encode", start, self._ns(end), attributes)
        for index, (join, ended) in enumerate(zip(self.joins, self.ends, strict=True)):
            if join is None and ended is None:
                continue
            begin = self.submitted if join is None else join[1]
            attributes = {"nmt.sentence": index}
            if join is not None:
                attributes["nmt.input_tokens"] = join[2]
            if ended is None:
                self._span("nmt.decode", begin, now_ns, attributes, error or "unfinished")
                continue
            attributes["nmt.decode.steps"], attributes["nmt.output_tokens"] = ended[1], ended[2]
            self._span("nmt.decode", begin, self._ns(ended[0]), attributes)

    def _ns(self, seconds: float) -> int:
        """A time on the loop's clock, as OpenTelemetry's nanoseconds since the epoch."""
        assert self.submitted is not None
        return self._wall_ns + round((seconds - self.submitted) * 1e9)

    def _span(
        self,
        name: str,
        start: float,
        end_ns: int,
        attributes: dict[str, Any],
        error: str | None = None,
    ) -> None:
        span = self._tracer.start_span(
            name,
            context=self._parent,
            attributes={**self._attributes, **attributes},
            start_time=self._ns(start),
        )
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=max(end_ns, self._ns(start)))


def _error_of(future: asyncio.Future) -> str | None:
    """How a job ended, if not with its results."""
    if future.cancelled():
        return "cancelled (deadline, client gone or shutdown)"
    error = future.exception()
    return None if error is None else f"{type(error).__name__}: {error}"
