"""What the translation cache buys: hit rate, latency and throughput, repeated vs unique traffic.

    python -m bench.cache_bench

Closed-loop clients send one-sentence requests (greedy) for a fixed time to a server with the
cache on and one with it off (NMT_CACHE_ENTRIES=0), side by side in one run, on two kinds of
traffic: "repeated" (80% of requests from 50 popular sentences, 20% never seen before, like UI
strings or bot templates) and "unique" (every request new). Writes the `cache` section of
docs/benchmarks.md. Sentences come from bench/reliability/traffic.py's made-up generator.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import ensure_bundle, running_server
from bench.reliability.traffic import DISTINCT_SENTENCES, french_sentence, ms, percentile
from bench.report import replace_section

POPULAR = 50


def sentence_stream(kind: str, seed: int):
    """Sentence indices: repeated (80% from POPULAR) or unique (each once)."""
    rng = random.Random(seed)
    fresh = POPULAR + seed * 100_000  # never among the popular ones, distinct per stream
    while True:
        if kind == "repeated" and rng.random() < 0.8:
            yield rng.randrange(POPULAR)
        else:
            fresh += 1
            yield fresh % DISTINCT_SENTENCES


async def closed_loop(url: str, kind: str, clients: int, seconds: float) -> list[float]:
    async def client(number: int) -> list[float]:
        stream = sentence_stream(kind, seed=number + 1)
        latencies = []
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            stop = time.monotonic() + seconds
            while time.monotonic() < stop:
                body = {
                    "text": french_sentence(next(stream)),
                    "source_lang": "fr",
                    "target_lang": "en",
                    "beam_size": 1,
                }
                started = time.perf_counter()
                response = await http.post("/v1/translate", json=body)
                response.raise_for_status()
                latencies.append(time.perf_counter() - started)
        return latencies

    found = await asyncio.gather(*(client(n) for n in range(clients)))
    return [latency for one in found for latency in one]


def hit_rate(url: str) -> float | None:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    counts = {"hit": 0.0, "miss": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name == "nmt_cache_lookups":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["result"]] += sample.value
    total = counts["hit"] + counts["miss"]
    return counts["hit"] / total if total else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    bundles = ensure_bundle()
    rows = []
    with tempfile.TemporaryDirectory() as logs:
        for kind in ("repeated", "unique"):
            for cache in (True, False):
                settings = {"threads": 1, "access_log": "false"}
                if not cache:
                    settings["cache_entries"] = 0
                with running_server(bundles, Path(logs), **settings) as server:
                    latencies = asyncio.run(
                        closed_loop(server.url, kind, args.clients, args.seconds)
                    )
                    rate = hit_rate(server.url) if cache else None
                summary = {f"p{q}_ms": ms(percentile(latencies, q)) for q in (50, 95, 99)}
                rows.append((kind, cache, len(latencies) / args.seconds, rate, summary))
                print(rows[-1], flush=True)

    lines = [
        "## Translation cache: repeated vs unique traffic",
        "",
        f"`python -m bench.cache_bench --seconds {args.seconds:g} --clients {args.clients}` "
        "(one-sentence greedy requests, closed loop, NMT_THREADS=1; cache on and off side by "
        "side in one run). Repeated: 80% of requests from 50 popular sentences; unique: "
        "every request new.",
        "",
        "| traffic | cache | requests/s | hit rate | p50 ms | p95 ms | p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, cache, rps, rate, summary in rows:
        hits = "–" if rate is None else f"{rate:.0%}"
        lines.append(
            f"| {kind} | {'on' if cache else 'off'} | {rps:.1f} | {hits} | "
            f"{summary['p50_ms']} | {summary['p95_ms']} | {summary['p99_ms']} |"
        )
    print("\n".join(lines))
    replace_section("cache", "\n".join(lines))


if __name__ == "__main__":
    main()
