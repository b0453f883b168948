"""The service as clients meet it: a real `nmt serve` process on a free loopback port, under
concurrent load. Batching, overload (429), deadlines (504), metrics and graceful shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.runtime.search import SearchOptions
from service.runtime.translator import Translator
from tests.conftest import FRENCH_SENTENCES, ROOT
from tests.servers import SERVE, free_port, running_server

SENTENCES = FRENCH_SENTENCES
BEAM = 2
OPTIONS = SearchOptions(beam_size=BEAM, max_length=256)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, parsed by prometheus_client, by (name, sorted labels)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: dict, name: str, **labels: str) -> float:
    if "model" in labels:  # the bundles served here are unversioned
        labels.setdefault("version", "")
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def body(text: str | list[str], **fields: object) -> dict:
    return {"text": text, "source_lang": "fr", "target_lang": "en", "beam_size": BEAM, **fields}


async def post_all(url: str, requests: list[tuple[str, dict, dict]]) -> list[httpx.Response]:
    """Send (path, json, headers) requests all at once, each on its own connection."""
    limits = httpx.Limits(max_connections=len(requests), max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        return await asyncio.gather(
            *(
                client.post(path, json=payload, headers=headers)
                for path, payload, headers in requests
            )
        )


async def until_admitted(client: httpx.AsyncClient, tasks: list[asyncio.Future]) -> None:
    """Until the server holds every one of these requests (or has already answered it)."""
    while True:
        families = text_string_to_metric_families((await client.get("/metrics")).text)
        in_progress = next(
            f.samples[0].value for f in families if f.name == "nmt_requests_in_progress"
        )
        if in_progress - 1 + sum(task.done() for task in tasks) >= len(tasks):  # -1: this scrape
            return
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def reference(translator: Translator) -> dict[str, str]:
    """Each sentence translated alone, one after the other: what the server must reproduce."""
    return {s: translator.translate([s], OPTIONS, batch_size=1)[0].text for s in SENTENCES}


def test_64_concurrent_requests_match_sequential_translation_and_are_batched(
    model_dir: Path, logs: Path, reference: dict[str, str]
):
    # No cache: repeated sentences must reach the engine, whose batches are counted here.
    settings = {"cache_entries": 0}
    with running_server(model_dir, logs, **settings) as server:
        requests, expected = [], []
        for i in range(64):
            first, second = SENTENCES[i % 16], SENTENCES[(i * 7 + 3) % 16]
            if i % 4 == 0:  # a text of two sentences, split by the server and rejoined
                payload, want = (
                    body(f"{first} {second}"),
                    [f"{reference[first]} {reference[second]}"],
                )
            elif i % 4 == 1:  # a list of texts
                payload, want = body([first, second]), [reference[first], reference[second]]
            else:
                payload, want = body(first), [reference[first]]
            requests.append(("/v1/translate", payload, {"X-Request-ID": f"load-{i}"}))
            expected.append(want)

        before = scrape(server.url)
        responses = asyncio.run(post_all(server.url, requests))
        after = scrape(server.url)

        for i, (response, want) in enumerate(zip(responses, expected, strict=True)):
            assert response.status_code == 200, response.text
            assert response.headers["x-request-id"] == f"load-{i}"
            assert [t["text"] for t in response.json()["translations"]] == want

        def moved(name: str, **labels: str) -> float:
            return sample(after, name, **labels) - sample(before, name, **labels)

        sentences = sum(2 if i % 4 in (0, 1) else 1 for i in range(64))
        ok = {"route": "/v1/translate", "model": "fr-en", "status": "200"}
        assert moved("nmt_requests_total", **ok) == 64
        assert (
            moved("nmt_request_duration_seconds_count", route="/v1/translate", model="fr-en") == 64
        )
        usage = [r.json()["usage"] for r in responses]
        assert moved("nmt_input_tokens_total", model="fr-en") == sum(
            u["input_tokens"] for u in usage
        )
        assert moved("nmt_output_tokens_total", model="fr-en") == sum(
            u["output_tokens"] for u in usage
        )
        assert moved("nmt_queue_wait_seconds_count", model="fr-en") == sentences
        assert moved("nmt_decode_steps_total", model="fr-en") > 0
        assert sample(after, "nmt_queue_depth", model="fr-en") == 0
        assert moved("nmt_batch_joined_sentences_total", model="fr-en") == sentences
        assert moved("nmt_batch_left_sentences_total", model="fr-en", reason="finished") == (
            sentences
        )
        steps = moved("nmt_batch_step_sentences_count", model="fr-en")
        occupancy = moved("nmt_batch_step_sentences_sum", model="fr-en") / steps
        assert occupancy > 2, f"{occupancy:.1f} sentences per step: steps were not shared"
        # Every request answered: nothing runs now (not the last step's batch, as it was).
        assert sample(after, "nmt_batch_current_size", model="fr-en") == 0
        assert sample(after, "nmt_batch_current_max_tokens", model="fr-en") == 0


def test_a_full_queue_answers_429_with_retry_after_at_once(model_dir: Path, logs: Path):
    settings = {
        "max_queue_sentences": 2,
        "max_batch_size": 1,
        "retry_after_seconds": 3,
    }
    with running_server(model_dir, logs, **settings) as server:
        native = [("/v1/translate", body(SENTENCES[i % 16]), {}) for i in range(24)]
        libre = [
            ("/translate", {"q": s, "source": "fr", "target": "en"}, {}) for s in SENTENCES[:8]
        ]
        responses = asyncio.run(post_all(server.url, native + libre))
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 429}
        assert statuses.count(429) > 0 and statuses.count(200) > 0, statuses
        for response, (path, _, _) in zip(responses, native + libre, strict=True):
            if response.status_code != 429:
                continue
            assert response.headers["retry-after"] == "3"
            if path == "/translate":
                assert response.json()["error"].startswith("Slowdown: ")
            else:
                assert "NMT_MAX_QUEUE_SENTENCES" in response.json()["detail"]
        refused = sum(
            sample(
                scrape(server.url), "nmt_requests_total", route=path, model="fr-en", status="429"
            )
            for path in ("/v1/translate", "/translate")
        )
        assert refused == statuses.count(429)


def test_connections_past_nmt_max_connections_get_503_and_the_next_ones_are_served(
    model_dir: Path, logs: Path
):
    """NMT_MAX_CONNECTIONS bounds open connections (1,000 slow clients were once all held
    open): with 3 idle connections held, a fourth client is answered 503 at once, except on
    health and metrics, which are answered whatever the count; once they close, it is served."""
    with running_server(model_dir, logs, max_connections=3) as server:
        host, port = server.url.removeprefix("http://").split(":")
        held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3)]
        try:
            # Once the server has accepted the three (a busy machine may take a moment), the
            # fourth is refused; without the limit this stays 200 and the deadline fails it.
            deadline = time.monotonic() + 10
            while (status := httpx.get(f"{server.url}/v1/models", timeout=10).status_code) != 503:
                assert time.monotonic() < deadline, f"still {status} with 3 connections held"
                time.sleep(0.1)
            for path in ("/healthz", "/readyz", "/metrics"):
                assert httpx.get(f"{server.url}{path}", timeout=10).status_code == 200, path
        finally:
            for connection in held:
                connection.close()
        deadline = time.monotonic() + 10
        while (status := httpx.get(f"{server.url}/v1/models", timeout=10).status_code) != 200:
            assert time.monotonic() < deadline, f"still {status} after the connections closed"
            time.sleep(0.1)


def test_a_request_past_its_deadline_gets_504_and_its_work_is_dropped(model_dir: Path, logs: Path):
    settings = {"request_timeout_seconds": 0.001}
    with running_server(model_dir, logs, **settings) as server:
        response = httpx.post(f"{server.url}/v1/translate", json=body(SENTENCES[0]), timeout=30)
        assert response.status_code == 504
        assert "NMT_REQUEST_TIMEOUT_SECONDS" in response.json()["detail"]
        time.sleep(0.3)  # had it not been dropped, it would have been decoded by now
        samples = scrape(server.url)
        # Dropped from the queue, or from the running batch if it joined within the 1 ms:
        # either way never decoded to its end.
        dropped = sum(
            sample(samples, "nmt_dropped_sentences_total", model="fr-en", reason=reason)
            for reason in ("deadline", "deadline_unreachable", "abandoned_in_batch")
        )
        assert dropped == 1
        finished = {"model": "fr-en", "reason": "finished"}
        assert sample(samples, "nmt_batch_left_sentences_total", **finished) == 0
        assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_a_client_that_disconnects_has_its_queued_work_dropped(model_dir: Path, logs: Path):
    """One sentence per batch and a backlog ahead: the impatient client's sentences are still
    queued when it hangs up, and must never be decoded. The backlog (108 sentences at beam 4,
    every one decoded: no cache) lasts about a second on a fast CPU, several times the 0.3 s
    the impatient client waits, so its sentences are still queued on any machine when it goes."""
    with running_server(model_dir, logs, max_batch_size=1, cache_entries=0) as server:
        backlog = [body(SENTENCES[i % 14 : i % 14 + 3], beam_size=4) for i in range(36)]

        async def scenario() -> None:
            limits = httpx.Limits(max_connections=48, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=120) as client:
                busy = [
                    asyncio.ensure_future(client.post("/v1/translate", json=b)) for b in backlog
                ]
                await until_admitted(client, busy)
                assert not all(t.done() for t in busy), "the backlog was gone too soon"
                with pytest.raises(httpx.TimeoutException):
                    await client.post(
                        "/v1/translate", json=body(SENTENCES[:4], beam_size=4), timeout=0.3
                    )
                assert not all(t.done() for t in busy), "the backlog was gone before the hang-up"
                assert all(r.status_code == 200 for r in await asyncio.gather(*busy))

        asyncio.run(scenario())
        samples = scrape(server.url)
        gone = {"model": "fr-en", "reason": "client_gone"}
        assert sample(samples, "nmt_dropped_sentences_total", **gone) == 4
        assert sample(samples, "nmt_batch_joined_sentences_total", model="fr-en") == 36 * 3
        assert (
            sample(
                samples, "nmt_requests_total", route="/v1/translate", model="fr-en", status="499"
            )
            == 1
        )


def test_sigterm_during_load_finishes_admitted_requests_and_exits_0(
    model_dir: Path, logs: Path, reference: dict[str, str]
):
    """One sentence per batch makes the admitted work last; SIGTERM arrives while it runs."""
    with running_server(model_dir, logs, max_batch_size=1) as server:
        texts = [" ".join(SENTENCES[i : i + 3]) for i in range(12)]
        expected = [" ".join(reference[s] for s in SENTENCES[i : i + 3]) for i in range(12)]

        async def scenario() -> tuple[list[httpx.Response], object]:
            limits = httpx.Limits(max_connections=16, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=120) as client:
                tasks = [
                    asyncio.ensure_future(client.post("/v1/translate", json=body(t))) for t in texts
                ]
                await until_admitted(client, tasks)
                assert sum(t.done() for t in tasks) < len(texts), "all done before SIGTERM"
                server.process.send_signal(signal.SIGTERM)
                # Newcomers are refused once the signal is handled: no listener any more, or
                # 503 while draining. (One sent before that is admitted and answered.)
                late: object = None
                deadline = time.monotonic() + 10
                while late is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                    try:
                        response = await client.post("/v1/translate", json=body("Bonjour."))
                    except httpx.TransportError as error:
                        late = error
                        continue
                    assert response.status_code in (200, 503), response.text
                    late = 503 if response.status_code == 503 else None
                return await asyncio.gather(*tasks), late

        responses, late = asyncio.run(scenario())
        assert late == 503 or isinstance(late, httpx.TransportError), late
        for response, want in zip(responses, expected, strict=True):
            assert response.status_code == 200, response.text
            assert response.json()["translations"][0]["text"] == want
        assert server.process.wait(60) == 0, server.log()
        assert "every admitted request was answered" in server.log()


def test_past_the_shutdown_timeout_admitted_requests_get_a_503_that_says_so(
    model_dir: Path, logs: Path
):
    """A request far longer than the shutdown timeout (hundreds of sentences, beam 4, one
    sentence per batch, on any CPU many seconds against 0.5 s) is answered 503 with the reason,
    not cut off; the process still exits 0, and its last log line counts it."""
    settings = {"shutdown_timeout_seconds": 0.5, "max_batch_size": 1, "threads": 1}
    with running_server(model_dir, logs, **settings) as server:
        # 256 distinct sentences: a sentence repeated in one request is decoded only once.
        texts = [" ".join(f"{s[:-1]}, {copy} fois{s[-1]}" for s in SENTENCES) for copy in range(16)]

        async def scenario() -> httpx.Response:
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                task = asyncio.ensure_future(
                    client.post("/v1/translate", json=body(texts, beam_size=4))
                )
                await until_admitted(client, [task])
                server.process.send_signal(signal.SIGTERM)
                return await task

        response = asyncio.run(scenario())
        assert response.status_code == 503, response.text
        assert "NMT_SHUTDOWN_TIMEOUT_SECONDS" in response.json()["detail"]
        assert server.process.wait(60) == 0, server.log()
        log = server.log()
        assert "1 admitted requests were still running" in log, log
        assert "every admitted request was answered" not in log


def test_serve_exits_1_and_says_why_when_no_model_can_be_loaded(tmp_path: Path):
    env = {**os.environ, "NMT_MODEL_DIR": str(tmp_path / "empty"), "NMT_PORT": str(free_port())}
    (tmp_path / "empty").mkdir()
    done = subprocess.run(
        SERVE, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    assert "no bundle under NMT_MODEL_DIR" in done.stderr
