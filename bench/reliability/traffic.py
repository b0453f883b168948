"""Requests and what came back. Every request the harness sends becomes one Outcome, so that
"nothing lost" is a count: sent = answered + transport errors, and each error is either one the
test caused on purpose (a server told to stop) or a lost request."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from bench.harness import Server

# 503 (not ready, shutting down) and 504 (past the deadline) are answers the server means to
# give under load; any other 5xx is a fault.
DESIGNED_5XX = frozenset({503, 504})
JSON = {"content-type": "application/json"}
# Probes and scrapes (/healthz, /readyz, /metrics): the access log has them only when they fail.
QUIET_KINDS = frozenset({"healthz", "probe"})


@dataclass
class Outcome:
    kind: str  # what the request was for: "native", "libre", "healthz", ...
    request_id: str
    sent_at: float  # time.monotonic(): the same clock in every process of this machine
    seconds: float  # until the answer, or the transport error
    status: int | None  # None: no HTTP answer came back
    error: str = ""  # the transport error's class when status is None
    detail: str = ""  # the start of the body of a 5xx, for the report

    @property
    def answered(self) -> bool:
        return self.status is not None


def client_limits(connections: int) -> httpx.Limits:
    """A pool of `connections`, dropping idle ones well before the server's keep-alive timeout
    (NMT_KEEP_ALIVE_SECONDS, 5 s): a request sent on a connection the server is closing as idle
    would fail with no answer, a loss the client's settings caused, not the server."""
    return httpx.Limits(
        max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=1.0
    )


async def send_raw(
    host: str, port: int, kind: str, path: str, body: bytes, timeout: float
) -> Outcome:
    """POST `body` as JSON on a new connection, closed after the answer: an independent client,
    as in an open loop. Plain asyncio streams, not httpx, whose pool costs the generator more
    per request than the server's answer takes once hundreds of requests are in flight."""
    request_id = uuid.uuid4().hex
    sent_at = time.monotonic()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nX-Request-ID: {request_id}\r\nConnection: close\r\n\r\n"
    )
    try:
        answer = await asyncio.wait_for(_exchange(host, port, head.encode() + body), timeout)
    except (OSError, TimeoutError) as error:
        return _finish(kind, request_id, sent_at, error)
    status_line, _, rest = answer.partition(b"\r\n")
    parts = status_line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        return Outcome(kind, request_id, sent_at, time.monotonic() - sent_at, None, "NoAnswer")
    status = int(parts[1])
    detail = rest.partition(b"\r\n\r\n")[2][:300].decode(errors="replace") if status >= 500 else ""
    return Outcome(kind, request_id, sent_at, time.monotonic() - sent_at, status, detail=detail)


async def _exchange(host: str, port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        return await reader.read()  # until the server closes: Connection: close
    finally:
        writer.close()


def _finish(
    kind: str, request_id: str, sent_at: float, result: httpx.Response | Exception
) -> Outcome:
    seconds = time.monotonic() - sent_at
    if isinstance(result, Exception):
        return Outcome(kind, request_id, sent_at, seconds, None, type(result).__name__)
    detail = result.text[:300] if result.status_code >= 500 else ""
    return Outcome(kind, request_id, sent_at, seconds, result.status_code, detail=detail)


def _headers(request_id: str, headers: dict[str, str] | None) -> dict[str, str]:
    return {"x-request-id": request_id, **(headers or {})}


async def send(
    client: httpx.AsyncClient,
    kind: str,
    method: str,
    path: str,
    *,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Outcome:
    """One request with its own X-Request-ID (to find it in the access log); never raises."""
    request_id = uuid.uuid4().hex
    sent_at = time.monotonic()
    try:
        response = await client.request(
            method, path, content=content, headers=_headers(request_id, headers)
        )
    except httpx.HTTPError as error:
        return _finish(kind, request_id, sent_at, error)
    return _finish(kind, request_id, sent_at, response)


def send_sync(
    client: httpx.Client,
    kind: str,
    method: str,
    path: str,
    *,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Outcome:
    request_id = uuid.uuid4().hex
    sent_at = time.monotonic()
    try:
        response = client.request(
            method, path, content=content, headers=_headers(request_id, headers)
        )
    except httpx.HTTPError as error:
        return _finish(kind, request_id, sent_at, error)
    return _finish(kind, request_id, sent_at, response)


def percentile(values: Iterable[float], q: float) -> float | None:
    data = list(values)
    return float(np.percentile(data, q)) if data else None


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def latency_summary(seconds: Iterable[float]) -> dict[str, Any]:
    data = list(seconds)
    return {
        "count": len(data),
        "p50_ms": ms(percentile(data, 50)),
        "p99_ms": ms(percentile(data, 99)),
        "max_ms": ms(max(data)) if data else None,
    }


def nothing_lost(
    outcomes: list[Outcome],
    server: Server | None = None,
    excused: Callable[[Outcome], bool] = lambda _: False,
) -> dict[str, Any]:
    """The "nothing lost" count. sent = answered + excused (errors the test caused) + lost.

    With the server, also checks the other side: each answered request that the access log
    covers (all but successful probes) has exactly one line there.
    """
    answered = [o for o in outcomes if o.answered]
    unanswered = [o for o in outcomes if not o.answered]
    lost = [o for o in unanswered if not excused(o)]
    count: dict[str, Any] = {
        "sent": len(outcomes),
        "answered": len(answered),
        "excused": len(unanswered) - len(lost),
        "lost": len(lost),
        "lost_errors": dict(Counter(o.error for o in lost)),
    }
    if server is not None:
        logged = server.access_log_ids()
        checked = [o for o in answered if o.kind not in QUIET_KINDS]
        count["access_log_missing"] = sum(1 for o in checked if logged[o.request_id] == 0)
        count["access_log_duplicated"] = sum(1 for o in checked if logged[o.request_id] > 1)
    return count


def status_counts(outcomes: Iterable[Outcome]) -> dict[str, int]:
    counts = Counter(str(o.status) if o.answered else o.error for o in outcomes)
    return dict(sorted(counts.items()))


def server_errors(outcomes: Iterable[Outcome]) -> dict[str, int]:
    """5xx answers: all of them, and those that are faults (not a designed 503/504)."""
    fives = [o for o in outcomes if o.status is not None and o.status >= 500]
    return {
        "5xx": len(fives),
        "unexpected_5xx": sum(1 for o in fives if o.status not in DESIGNED_5XX),
    }


class Periodic:
    """Something done every `interval` seconds from a thread of its own, for as long as a
    measurement runs (a `with` block); subclasses say what (`tick`), and may open what the
    ticks share around the loop (`run`)."""

    name = "periodic"

    def __init__(self, interval_seconds: float) -> None:
        self.interval = interval_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)

    def __enter__(self) -> Periodic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def run(self) -> None:
        self.loop(self.tick)

    def loop(self, tick: Callable[[], None]) -> None:
        while not self._stop.is_set():
            tick()
            self._stop.wait(self.interval)

    def tick(self) -> None:
        raise NotImplementedError


class HealthProber(Periodic):
    """GET /healthz at a steady pace from its own thread and connection, for as long as a
    measurement runs: if anything blocks the server's event loop, these latencies show it."""

    name = "healthz-prober"

    def __init__(self, url: str, interval_seconds: float = 0.05) -> None:
        super().__init__(interval_seconds)
        self.url = url
        self.outcomes: list[Outcome] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            self.loop(lambda: self.outcomes.append(send_sync(client, "healthz", "GET", "/healthz")))

    def summary(self) -> dict[str, Any]:
        answered = [o.seconds for o in self.outcomes if o.status == 200]
        return {
            **latency_summary(answered),
            "over_50ms": sum(1 for s in answered if s > 0.05),
            "failed": sum(1 for o in self.outcomes if o.status != 200),
        }


# Caption-like French sentences (Multi30k's domain), written for the harness: 10,000 distinct
# ones, so that a measurement can keep the server's translation cache from answering for the model.
SUBJECTS = [
    "Un homme", "Une femme", "Un enfant", "Un garçon", "Une petite fille", "Un vieil homme",
    "Un étudiant", "Une jeune femme", "Un chien", "Un groupe de personnes",
]  # fmt: skip
ACTIONS = [
    "marche", "court", "attend", "joue", "mange une glace", "lit un livre", "chante",
    "fait du vélo", "regarde la mer", "parle au téléphone",
]  # fmt: skip
PLACES = [
    "dans la rue", "sur la plage", "dans un parc", "devant une gare", "sur un pont",
    "dans un restaurant", "sur une route de montagne", "près d'une fontaine", "dans un champ",
    "sur un terrain de football",
]  # fmt: skip
TIMES = [
    "", " ce matin", " sous la pluie", " au soleil", " le soir", " en hiver", " avec un ami",
    " en souriant", " sans chaussures", " pendant la fête",
]  # fmt: skip
DISTINCT_SENTENCES = len(SUBJECTS) * len(ACTIONS) * len(PLACES) * len(TIMES)


def french_sentence(index: int) -> str:
    """The index-th of the distinct sentences (it wraps around)."""
    index, subject = divmod(index, len(SUBJECTS))
    index, action = divmod(index, len(ACTIONS))
    index, place = divmod(index, len(PLACES))
    time_of = TIMES[index % len(TIMES)]
    return f"{SUBJECTS[subject]} {ACTIONS[action]} {PLACES[place]}{time_of}."


def translate_body(sentences: int, offset: int = 0, **fields: object) -> bytes:
    """A native request of `sentences` texts (one sentence each), as bytes."""
    texts = [french_sentence(offset + i) for i in range(sentences)]
    body = {"text": texts, "source_lang": "fr", "target_lang": "en", **fields}
    return json.dumps(body).encode()


def idle_healthz(url: str, probes: int = 40) -> dict[str, Any]:
    """/healthz with no other traffic: the baseline the probes under load compare with."""
    with httpx.Client(base_url=url, timeout=10) as client:
        outcomes = [send_sync(client, "healthz", "GET", "/healthz") for _ in range(probes)]
    return latency_summary(o.seconds for o in outcomes if o.status == 200)
