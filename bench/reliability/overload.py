"""Overload: capacity measured first (closed loop), then an open-loop arrival rate of a multiple
of it, with a small model queue so that most requests must be refused with 429.

The load generator runs in its own process (asyncio; httpx for the closed loop, a connection
per request on plain asyncio streams for the open loop), so that its event loop and the
/healthz prober (a thread here) do not slow each other down; both still share the machine's
two cores with the server, which is why the generator's own lateness is reported too.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import httpx

from bench.harness import ROOT, running_server
from bench.reliability.report import access_log_cell, inline, lat, lost_cell
from bench.reliability.traffic import (
    JSON,
    HealthProber,
    Outcome,
    client_limits,
    idle_healthz,
    latency_summary,
    ms,
    nothing_lost,
    percentile,
    send,
    send_raw,
    server_errors,
    status_counts,
    translate_body,
)

CLIENT_TIMEOUT_SECONDS = 60.0


@dataclass
class OpenLoopRun:
    outcomes: list[Outcome] = field(default_factory=list)
    lateness: list[float] = field(default_factory=list)  # actual send time - scheduled time
    not_sent: int = 0  # arrivals dropped because the generator's in-flight cap was reached


def _bodies(sentences: int) -> Iterator[bytes]:
    """Requests of `sentences` texts, each of distinct sentences (the cache is off anyway)."""
    for index in itertools.count():
        yield translate_body(sentences, offset=index * sentences)


async def _translate(client: httpx.AsyncClient, body: bytes) -> Outcome:
    return await send(client, "native", "POST", "/v1/translate", content=body, headers=JSON)


def closed_loop(url: str, sentences: int, clients: int, seconds: float) -> list[Outcome]:
    """`clients` loops each sending the next request as soon as the last is answered."""
    return asyncio.run(_closed_loop(url, sentences, clients, seconds))


async def _closed_loop(url: str, sentences: int, clients: int, seconds: float) -> list[Outcome]:
    bodies = _bodies(sentences)
    stop_at = time.monotonic() + seconds
    limits = client_limits(clients)
    async with httpx.AsyncClient(
        base_url=url, timeout=CLIENT_TIMEOUT_SECONDS, limits=limits
    ) as client:

        async def one_client() -> list[Outcome]:
            done = []
            while time.monotonic() < stop_at:
                done.append(await _translate(client, next(bodies)))
            return done

        results = await asyncio.gather(*(one_client() for _ in range(clients)))
    return [outcome for result in results for outcome in result]


def open_loop(
    url: str, sentences: int, rate: float, seconds: float, max_in_flight: int, seed: int
) -> OpenLoopRun:
    """Poisson arrivals at `rate` per second, whatever the answers: the load a crowd of
    independent clients puts on a server, which a closed loop can never exceed."""
    return asyncio.run(_open_loop(url, sentences, rate, seconds, max_in_flight, seed))


async def _open_loop(
    url: str, sentences: int, rate: float, seconds: float, max_in_flight: int, seed: int
) -> OpenLoopRun:
    rng = random.Random(seed)
    bodies = _bodies(sentences)
    run = OpenLoopRun()
    in_flight: set[asyncio.Task[Outcome]] = set()

    def finished(task: asyncio.Task[Outcome]) -> None:
        in_flight.discard(task)
        run.outcomes.append(task.result())

    address = httpx.URL(url)
    host, port = address.host, address.port or 80
    start = time.monotonic()
    scheduled = start
    while scheduled < start + seconds:
        delay = scheduled - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        run.lateness.append(time.monotonic() - scheduled)
        if len(in_flight) >= max_in_flight:
            run.not_sent += 1
        else:
            body = next(bodies)
            request = send_raw(host, port, "native", "/v1/translate", body, CLIENT_TIMEOUT_SECONDS)
            task = asyncio.create_task(request)
            in_flight.add(task)
            task.add_done_callback(finished)
        scheduled += rng.expovariate(rate)
    while in_flight:
        await asyncio.wait(set(in_flight))
    return run


def capacity_per_second(outcomes: list[Outcome], warmup: float) -> float:
    """Requests answered 200 per second, after the warm-up (the queue filling, batches forming)."""
    start = min(o.sent_at for o in outcomes) + warmup
    end = max(o.sent_at + o.seconds for o in outcomes)
    done = [o for o in outcomes if o.status == 200 and o.sent_at + o.seconds >= start]
    return len(done) / max(end - start, 1e-9)


def run_overload(
    model_dir: Path,
    work_dir: Path,
    seconds: float = 60.0,
    capacity_seconds: float = 15.0,
    factor: float = 4.0,
    queue_sentences: int = 64,
    deadline: float = 10.0,
    clients: int = 8,
    sentences_per_request: int = 4,
    max_in_flight: int = 1000,
    seed: int = 4,
    server_settings: dict[str, Any] | None = None,
    tree: Path = ROOT,
) -> dict[str, Any]:
    settings = {
        "max_queue_sentences": queue_sentences,
        "request_timeout_seconds": deadline,
        "cache_entries": 0,  # every request decoded: the model's capacity, not the cache's
        **(server_settings or {}),  # e.g. threads, thread_spinning: to compare server set-ups
    }
    sentences = sentences_per_request
    spawn = get_context("spawn")
    with (
        running_server(model_dir, work_dir, tree=tree, **settings) as server,
        ProcessPoolExecutor(1, mp_context=spawn) as generator,
    ):
        idle = idle_healthz(server.url)
        measured = generator.submit(closed_loop, server.url, sentences, clients, capacity_seconds)
        capacity_outcomes = measured.result()
        capacity = capacity_per_second(capacity_outcomes, warmup=min(3.0, capacity_seconds / 3))
        rate = factor * capacity
        with HealthProber(server.url) as prober:
            run = generator.submit(
                open_loop, server.url, sentences, rate, seconds, max_in_flight, seed
            ).result()
        lost = nothing_lost(capacity_outcomes + run.outcomes, server)
        server_side = _server_side(server.access_log(), run.outcomes)
        error_lines = server.error_lines()
    return {
        "test": "overload",
        "settings": {
            **server.settings,
            "seconds": seconds,
            "factor": factor,
            "clients_for_capacity": clients,
            "sentences_per_request": sentences_per_request,
        },
        "capacity_rps": round(capacity, 1),
        # how long a full queue takes to drain at capacity: the least an admitted request waits
        "full_queue_wait_s": round(queue_sentences / (capacity * sentences_per_request), 2),
        "capacity_statuses": status_counts(capacity_outcomes),
        "offered_rps": round(rate, 1),
        **_open_loop_summary(run, seconds, deadline),
        "server_side": server_side,
        "healthz_idle": idle,
        "healthz": prober.summary(),
        "server_error_log": error_lines,
        "nothing_lost": lost,
    }


def _server_side(
    access_log: dict[str, dict[str, Any]], outcomes: list[Outcome]
) -> dict[str, dict[str, Any]]:
    """Latency by status as the server measured it (its access log: from the request's headers
    read to the answer sent). The gap to the client's numbers is time spent before the app saw
    the request (connection accept, reading, the load generator's own delays)."""
    by_status: dict[str, list[float]] = {}
    for o in outcomes:
        record = access_log.get(o.request_id)
        if record is not None:
            by_status.setdefault(str(record["status"]), []).append(record["latency_ms"] / 1000)
    return {status: latency_summary(values) for status, values in sorted(by_status.items())}


def _open_loop_summary(run: OpenLoopRun, seconds: float, deadline: float) -> dict[str, Any]:
    outcomes = run.outcomes
    ok = [o.seconds for o in outcomes if o.status == 200]
    late = [o.seconds for o in outcomes if o.status == 504]
    return {
        "sent_rps": round(len(outcomes) / seconds, 1),
        "not_sent": run.not_sent,
        "generator_lateness_p99_ms": ms(percentile(run.lateness, 99)),
        "statuses": status_counts(outcomes),
        **server_errors(outcomes),
        "goodput_rps": round(len(ok) / seconds, 1),
        "rejected_429": latency_summary(o.seconds for o in outcomes if o.status == 429),
        "admitted_200": latency_summary(ok),
        "admitted_within_deadline": sum(1 for s in ok if s <= deadline),
        "timed_out_504": latency_summary(late),
        "deadline_s": deadline,
        "unexpected": [o.detail for o in outcomes if o.status not in (200, 429, 504)][:5],
    }


def markdown(result: dict[str, Any]) -> str:
    s, lost, health = result["settings"], result["nothing_lost"], result["healthz"]
    ok, refused, late = result["admitted_200"], result["rejected_429"], result["timed_out_504"]
    lateness = f"{result['generator_lateness_p99_ms']} ms / {result['not_sent']}"
    in_time = f"{result['admitted_within_deadline']} of {ok['count']}"
    clients = s["clients_for_capacity"]

    def server_lat(status: str) -> str:
        summary = result["server_side"].get(status)
        return lat(summary) if summary else "none"

    return f"""## Overload: {s["factor"]:g}x measured capacity, open loop

```sh
.venv/bin/python -m bench.reliability overload --seconds {s["seconds"]:g}
```

Server: `NMT_MAX_QUEUE_SENTENCES={s["NMT_MAX_QUEUE_SENTENCES"]}`,
`NMT_REQUEST_TIMEOUT_SECONDS={s["NMT_REQUEST_TIMEOUT_SECONDS"]}`, `NMT_CACHE_ENTRIES=0` (every
sentence decoded), other settings default (beam 4). Every request: {s["sentences_per_request"]}
one-sentence texts, distinct sentences. Capacity: {clients} closed-loop
clients; then Poisson arrivals at {s["factor"]:g}x that rate for {s["seconds"]:g} s
from a separate process, while a prober times `GET /healthz` every 50 ms.

| | target | measured |
|---|---|---|
| capacity (closed loop), requests/s | | {result["capacity_rps"]} |
| a full queue drains in (queue ÷ capacity) | | {result["full_queue_wait_s"]} s |
| offered / sent, requests/s | 4x capacity | {result["offered_rps"]} / {result["sent_rps"]} |
| load generator lateness p99 / arrivals not sent | | {lateness} |
| answers | | {inline(result["statuses"])} |
| 5xx (all / not a designed 503 or 504) | 0 | {result["5xx"]} / {result["unexpected_5xx"]} |
| goodput (200s per second) | | {result["goodput_rps"]} |
| 429 latency p50 / p99 / max, at the client | p99 under 50 ms | {lat(refused)} |
| 429 latency p50 / p99 / max, in the server's access log | | {server_lat("429")} |
| 200 latency p50 / p99 / max, at the client | | {lat(ok)} |
| 200 latency p50 / p99 / max, in the server's access log | | {server_lat("200")} |
| 200s within the {result["deadline_s"]:g} s deadline | all | {in_time} |
| 504 latency p50 / p99 / max | | {lat(late)} |
| `/healthz` p50 / p99 / max ({health["count"]} probes) | p99 under 50 ms | {lat(health)} |
| `/healthz` with no other traffic | | {lat(result["healthz_idle"])} |
| nothing lost (capacity and overload phases) | 0 lost | {lost_cell(lost)} |
| answers missing from / twice in the access log | 0 / 0 | {access_log_cell(lost)} |
"""
