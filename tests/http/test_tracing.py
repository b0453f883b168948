"""Traces (service/serving/tracing.py): one request through the real app and the committed
model, its spans caught by the SDK's in-memory exporter, each linked to the request's span; the
decoding loop's spans from a fake model, for a job that ends early; and tracing off, where the
SDK is never imported."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from service.http.app import create_app
from service.serving.settings import Settings
from service.serving.tracing import Tracing, model_attributes, new_provider, traces_endpoint
from tests.conftest import ROOT
from tests.serving.test_loop import GREEDY, Harness, sentence

SERVICE_SPANS = ("nmt.prepare", "nmt.queue", "nmt.encode", "nmt.decode", "nmt.assemble")
# OpenTelemetry's nanoseconds come from time.time_ns(), the loop's from time.monotonic():
# tied once per job, they may differ by what separates the two readings.
SLACK_NS = 2_000_000


def traced_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = new_provider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture(scope="module")
def traced(model_dir: Path) -> Iterator[tuple[TestClient, InMemorySpanExporter]]:
    provider, exporter = traced_provider()
    settings = Settings(model_dir=model_dir, threads=1, warmup=False, cache_entries=0)
    client = TestClient(create_app(settings, tracing=Tracing(provider)))
    client.__enter__()
    deadline = time.monotonic() + 120
    while client.get("/healthz").json()["status"] == "starting":
        assert time.monotonic() < deadline, "models did not load in time"
        time.sleep(0.05)
    yield client, exporter
    client.__exit__(None, None, None)


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


def ancestors(span: ReadableSpan, spans: list[ReadableSpan]) -> list[ReadableSpan]:
    """The chain of parents of `span` among `spans`, nearest first."""
    of_id = {s.context.span_id: s for s in spans}
    chain = []
    while span.parent is not None and span.parent.span_id in of_id:
        span = of_id[span.parent.span_id]
        chain.append(span)
    return chain


def test_one_request_is_traced_from_its_span_to_each_sentence(traced):
    client, exporter = traced
    exporter.clear()
    texts = [
        "Un homme en chemise bleue marche dans la rue. Le chien court après la balle.",
        "Un chat dort sur un canapé.",
    ]
    response = client.post(
        "/v1/translate",
        json={"text": texts, "source_lang": "fr", "target_lang": "en", "beam_size": 2},
    )
    assert response.status_code == 200, response.text
    # The job's spans are made once its future is done, the request's when the answer is sent.
    deadline = time.monotonic() + 10
    while "nmt.decode" not in by_name(exporter.get_finished_spans()):
        assert time.monotonic() < deadline, "the job's spans never came"
        time.sleep(0.01)
    spans = list(exporter.get_finished_spans())
    named = by_name(spans)

    (request,) = [s for s in spans if s.kind == SpanKind.SERVER]
    assert request.name == "POST /v1/translate"
    assert request.attributes["nmt.model"] == "fr-en"
    for name in SERVICE_SPANS:
        assert name in named, f"no {name} span among {sorted(named)}"
    assert len(named["nmt.prepare"]) == len(named["nmt.assemble"]) == 1

    for span in (s for name in SERVICE_SPANS for s in named[name]):
        assert span.context.trace_id == request.context.trace_id, span.name
        assert request in ancestors(span, spans), f"{span.name} is not under the request"
        assert span.attributes["nmt.model"] == "fr-en", span.name
        # The version, where the registry has one, is the request's too.
        assert span.attributes.get("nmt.model.version") == request.attributes.get(
            "nmt.model.version"
        )
        assert span.start_time <= span.end_time, span.name
        assert request.start_time - SLACK_NS <= span.start_time, span.name
        assert span.end_time <= request.end_time + SLACK_NS, span.name

    # Three sentences: each queued, encoded and decoded once.
    assert sum(s.attributes["nmt.sentences"] for s in named["nmt.queue"]) == 3
    assert sum(s.attributes["nmt.sentences"] for s in named["nmt.encode"]) == 3
    decodes = named["nmt.decode"]
    assert sorted(s.attributes["nmt.sentence"] for s in decodes) == [0, 1, 2]
    for decode in decodes:
        assert decode.status.status_code != StatusCode.ERROR
        assert decode.attributes["nmt.beam_size"] == 2
        assert decode.attributes["nmt.output_tokens"] > 0
        # a step per token produced, and one more for </s> unless the length limit came first
        assert decode.attributes["nmt.decode.steps"] >= decode.attributes["nmt.output_tokens"]
        assert decode.attributes["nmt.input_tokens"] > 0
    # In order: tokenized, queued, decoded, assembled.
    (prepare,), (assemble,) = named["nmt.prepare"], named["nmt.assemble"]
    first_join = min(s.end_time for s in named["nmt.queue"])
    assert prepare.end_time <= min(s.start_time for s in named["nmt.queue"]) + SLACK_NS
    assert first_join <= min(s.start_time for s in decodes) + SLACK_NS
    assert max(s.end_time for s in decodes) <= assemble.start_time + SLACK_NS


def test_probes_are_not_traced(traced):
    client, exporter = traced
    exporter.clear()
    for path in ("/healthz", "/readyz", "/metrics"):
        assert client.get(path).status_code == 200
    assert client.get("/v1/models").status_code == 200
    assert [s.name for s in exporter.get_finished_spans()] == ["GET /v1/models"]


def test_a_job_that_ends_early_has_its_unfinished_sentences_marked():
    """The loop alone, on a fake model and clock: times are the loop's, steps the fake's, and
    a job cancelled midway gets spans for what it did, ending in an error."""
    provider, exporter = traced_provider()
    tracing = Tracing(provider)
    harness = Harness(max_sentences=1)  # one sentence runs at a time: the second waits
    model = SimpleNamespace(name="fr-en", version=3)

    async def test() -> None:
        with provider.get_tracer("test").start_as_current_span("request") as request:
            trace = tracing.job(model, 2, GREEDY.beam_size)
            assert trace is not None
            job = harness.loop.submit(
                [sentence(1, steps=3), sentence(2, steps=4)], GREEDY, 1e9, trace=trace
            )
            job.name = "traced"  # (the fake batch labels its sentences with it)
        job.future.add_done_callback(trace.end)
        harness.clock.now += 0.5  # queued for half a second
        for _ in range(3):  # joins, then three steps: the first sentence ends
            harness.loop.work_once()
            harness.clock.now += 0.01
        harness.loop.cancel(job, "client_gone")
        await asyncio.sleep(0)
        assert request.attributes["nmt.model.version"] == "3"

    asyncio.run(test())
    named = by_name(exporter.get_finished_spans())
    (decoded,) = named["nmt.decode"]
    assert decoded.attributes["nmt.decode.steps"] == 3
    assert decoded.attributes["nmt.model.version"] == "3"
    assert decoded.status.status_code == StatusCode.UNSET
    (encoded,) = named["nmt.encode"]
    assert encoded.attributes["nmt.sentences"] == 1
    joined, waiting = sorted(named["nmt.queue"], key=lambda s: s.status.status_code.value)
    assert round((joined.end_time - joined.start_time) / 1e9, 3) == 0.5
    assert round((decoded.end_time - decoded.start_time) / 1e9, 3) == 0.02
    assert waiting.status.status_code == StatusCode.ERROR
    assert "cancelled" in waiting.status.description
    (request,) = named["request"]
    for span in (*named["nmt.queue"], decoded, encoded):
        assert span.parent.span_id == request.context.span_id


def test_no_span_without_a_traced_request():
    """A document's chunks run outside any request: nothing to hang their spans on."""
    provider, exporter = traced_provider()
    tracing = Tracing(provider)
    model = SimpleNamespace(name="fr-en")
    assert tracing.job(model, 1, 1) is None
    with tracing.span("nmt.prepare", model):
        pass
    assert exporter.get_finished_spans() == ()
    assert Tracing().job(model, 1, 1) is None  # off


def test_model_attributes_name_the_version_only_where_there_is_one():
    assert model_attributes(SimpleNamespace(name="fr-en")) == {"nmt.model": "fr-en"}
    versioned = model_attributes(SimpleNamespace(name="fr-en", version=2))
    assert versioned == {"nmt.model": "fr-en", "nmt.model.version": "2"}


@pytest.mark.parametrize(
    ("setting", "environ", "endpoint"),
    [
        ("", {}, None),
        ("http://collector:4318", {}, "http://collector:4318/v1/traces"),
        ("http://collector:4318/", {}, "http://collector:4318/v1/traces"),
        ("https://c.example/v1/traces", {}, "https://c.example/v1/traces"),
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http://c:4318/v1/traces"),
        ("", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:9/t"}, "http://c:9/t"),
        (
            "http://mine:4318",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://theirs:4318"},
            "http://mine:4318/v1/traces",
        ),
        ("http://collector:4318", {"OTEL_SDK_DISABLED": "true"}, None),
    ],
)
def test_the_endpoint_comes_from_the_setting_or_opentelemetrys_variables(
    setting: str, environ: dict[str, str], endpoint: str | None
):
    assert traces_endpoint(setting, environ) == endpoint


def test_tracing_off_imports_no_sdk_and_traces_no_job(tmp_path: Path):
    """Off (the default), the app never imports the SDK, and the loop's jobs carry no trace."""
    code = (
        "import sys\n"
        "from service.http.app import create_app\n"
        "from service.serving.settings import Settings\n"
        f"app = create_app(Settings(model_dir={str(tmp_path)!r}))\n"
        "assert not app.state.service.tracing.on\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'))\n"
        "assert not loaded, loaded\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.pop("NMT_OTLP_ENDPOINT", None)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env)


def test_an_endpoint_turns_tracing_on(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("NMT_OTLP_ENDPOINT", "http://127.0.0.1:9/")
    tracing = Tracing.from_settings(Settings())
    try:
        assert tracing.on
    finally:
        tracing.shutdown()  # nothing was sent: nothing waits
