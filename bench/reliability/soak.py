"""Soak: steady mixed traffic for minutes, watching the server process from /proc: memory
(RSS) after warm-up against the end, open file descriptors, and p99 latency per window.

A leak shows as RSS or fds that keep climbing after warm-up; a slow degradation (a growing
queue, a cache without bound) as a p99 that climbs window after window.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.harness import Server, running_server
from bench.reliability.report import access_log_cell, inline, lost_cell
from bench.reliability.traffic import (
    DISTINCT_SENTENCES,
    JSON,
    Outcome,
    client_limits,
    french_sentence,
    ms,
    nothing_lost,
    percentile,
    send,
    server_errors,
    status_counts,
    translate_body,
)

SAMPLE_EVERY_SECONDS = 5.0
CLIENT_TIMEOUT_SECONDS = 60.0
TRANSLATIONS = ("native", "libre")


@dataclass
class Sample:
    at: float  # seconds since the start
    rss_bytes: int
    open_fds: int


@dataclass
class SoakRun:
    outcomes: list[Outcome] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)


def _sentence_index(rng: random.Random) -> int:
    # from 10,000 distinct sentences: the translation cache (on, as by default) fills as
    # traffic goes on, hits and misses mixed
    return rng.randrange(DISTINCT_SENTENCES)


def _libre_body(rng: random.Random) -> bytes:
    text = french_sentence(_sentence_index(rng))
    return json.dumps({"q": text, "source": "fr", "target": "en"}).encode()


def _next_request(rng: random.Random) -> tuple[str, str, str, bytes | None]:
    """(kind, method, path, body): what real clients mix, translations mostly."""
    roll = rng.random()
    if roll < 0.45:
        return "native", "POST", "/v1/translate", translate_body(1, _sentence_index(rng))
    if roll < 0.60:
        body = translate_body(rng.randint(2, 4), _sentence_index(rng), beam_size=1)
        return "native", "POST", "/v1/translate", body
    if roll < 0.80:
        return "libre", "POST", "/translate", _libre_body(rng)
    if roll < 0.85:  # invalid: an unknown language pair (404) and an empty text list (422)
        unknown = b'{"text": "x", "source_lang": "xx", "target_lang": "en"}'
        return "invalid", "POST", "/v1/translate", rng.choice([unknown, b'{"text": []}'])
    if roll < 0.90:
        return "other", "GET", rng.choice(["/v1/models", "/languages"]), None
    return "probe", "GET", rng.choice(["/readyz", "/metrics", "/healthz"]), None


async def _soak(server: Server, seconds: float, clients: int, seed: int) -> SoakRun:
    run = SoakRun()
    start = time.monotonic()
    stop_at = start + seconds
    limits = client_limits(clients)
    async with httpx.AsyncClient(
        base_url=server.url, timeout=CLIENT_TIMEOUT_SECONDS, limits=limits
    ) as client:

        async def one_client(rng: random.Random) -> None:
            while time.monotonic() < stop_at:
                kind, method, path, body = _next_request(rng)
                headers = JSON if body is not None else None
                run.outcomes.append(
                    await send(client, kind, method, path, content=body, headers=headers)
                )

        async def sampler() -> None:
            while True:
                now = time.monotonic()
                run.samples.append(Sample(now - start, server.rss_bytes(), server.open_fds()))
                if now >= stop_at:
                    return
                await asyncio.sleep(min(SAMPLE_EVERY_SECONDS, stop_at - now))

        await asyncio.gather(
            *(one_client(random.Random(seed + i)) for i in range(clients)), sampler()
        )
    return run


def _windows(outcomes: list[Outcome], start: float, window: float) -> list[dict[str, Any]]:
    """Translations per window of `window` seconds: count, p50 and p99 latency, non-2xx."""
    grouped: dict[int, list[Outcome]] = {}
    for o in outcomes:
        if o.kind in TRANSLATIONS:
            grouped.setdefault(int((o.sent_at - start) // window), []).append(o)
    return [
        {
            "window": index + 1,
            "translations": len(group),
            "p50_ms": ms(percentile((o.seconds for o in group), 50)),
            "p99_ms": ms(percentile((o.seconds for o in group), 99)),
            "not_200": sum(1 for o in group if o.status != 200),
        }
        for index, group in sorted(grouped.items())
    ]


def _memory(samples: list[Sample], warmup: float) -> dict[str, Any]:
    after = [s for s in samples if s.at >= warmup] or samples[-1:]
    first, last = after[0], samples[-1]
    mib = 1024 * 1024
    return {
        "rss_start_mib": round(samples[0].rss_bytes / mib, 1),
        "rss_after_warmup_mib": round(first.rss_bytes / mib, 1),
        "rss_end_mib": round(last.rss_bytes / mib, 1),
        "rss_max_mib": round(max(s.rss_bytes for s in after) / mib, 1),
        "rss_growth_percent": round(100 * (last.rss_bytes - first.rss_bytes) / first.rss_bytes, 2),
        "fds_after_warmup": first.open_fds,
        "fds_end": last.open_fds,
        "fds_min_max": [min(s.open_fds for s in after), max(s.open_fds for s in after)],
    }


def run_soak(
    model_dir: Path,
    work_dir: Path,
    seconds: float = 600.0,
    warmup: float = 60.0,
    window: float = 60.0,
    clients: int = 4,
    seed: int = 10,
) -> dict[str, Any]:
    with running_server(model_dir, work_dir) as server:
        started = time.monotonic()
        run = asyncio.run(_soak(server, seconds, clients, seed))
        lost = nothing_lost(run.outcomes, server)
        error_lines = server.error_lines()
    return {
        "test": "soak",
        "settings": {"seconds": seconds, "warmup": warmup, "window": window, "clients": clients},
        "requests": len(run.outcomes),
        "statuses": status_counts(run.outcomes),
        **server_errors(run.outcomes),
        **_memory(run.samples, warmup),
        "windows": _windows(run.outcomes, started, window),
        "samples": [[round(s.at, 1), s.rss_bytes, s.open_fds] for s in run.samples],
        "server_error_log": error_lines,
        "nothing_lost": lost,
    }


def markdown(result: dict[str, Any]) -> str:
    s, lost = result["settings"], result["nothing_lost"]
    rss = (
        f"{result['rss_after_warmup_mib']} → {result['rss_end_mib']} MiB "
        f"(max {result['rss_max_mib']})"
    )
    low, high = result["fds_min_max"]
    fds = f"{result['fds_after_warmup']} → {result['fds_end']} ({low}–{high})"
    windows = "\n".join(
        f"| {w['window']} | {w['translations']} | {w['p50_ms']} | {w['p99_ms']} | {w['not_200']} |"
        for w in result["windows"]
    )
    return f"""## Soak: {s["seconds"] / 60:g} minutes of steady mixed traffic

```sh
.venv/bin/python -m bench.reliability soak --minutes {s["seconds"] / 60:g}
```

{s["clients"]} closed-loop clients, each sending the next request as soon as the last is
answered: one-sentence native translations (beam 4), 2–4 texts at beam 1, LibreTranslate
`/translate`, invalid requests (404, 422), and `GET` of `/v1/models`, `/languages`, `/readyz`,
`/metrics`, `/healthz`; sentences drawn from 10,000 distinct ones, with the translation cache on
(the default), so hits and misses mix. RSS and open fds of the server process from `/proc`
every 5 s; the warm-up is the first {s["warmup"]:g} s.

| | target | measured |
|---|---|---|
| requests | | {result["requests"]} ({inline(result["statuses"])}) |
| 5xx | 0 | {result["5xx"]} |
| RSS after warm-up → end | | {rss} |
| RSS growth after warm-up | under 10% | {result["rss_growth_percent"]}% |
| open fds after warm-up → end (min–max) | flat | {fds} |
| nothing lost | 0 lost | {lost_cell(lost)} |
| answers missing from / twice in the access log | 0 / 0 | {access_log_cell(lost)} |

Translations per {s["window"]:g} s window (target: p99 flat):

| window | translations | p50 (ms) | p99 (ms) | not 200 |
|---|---|---|---|---|
{windows}
"""
