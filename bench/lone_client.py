"""A lone client: continuous against request-level batching, request by request.

    .venv/bin/python -m bench.lone_client --model-dir build/models

Issue 13 asks that continuous batching leave a lone client no slower than request-level
batching (what a lone client got before it). service_bench's closed loop at one client plays
rounds of a few seconds on each server in turn, and this machine's speed drifts by a fifth
within a minute: its round-by-round ratios spread from 0.75x to 1.34x, too wide to tell a few
percent. Here every request is sent to both servers, one right after the other (which goes
first alternates), and the ratio is taken within each pair, milliseconds apart: drift falls
out of it. Reported per search (greedy, beam 4): the median latency of each server, the
median of the per-pair ratios and a 95% bootstrap interval of that median.

Both servers are `nmt serve` with their defaults but NMT_BATCHING and the translation cache
(off: the sentences repeat). Writes the "lone-client" section of docs/benchmarks.md. A
benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from bench.report import opening, replace_section
from bench.service_bench import (
    CONTINUOUS,
    MULTI30K_TEST,
    REQUEST,
    client_session,
    ensure_bundles,
    load_sentences,
    server,
    translate_once,
)

SEARCHES = {"greedy": 1, "beam 4": 4}


async def pairs(
    urls: dict[str, str], work: list[tuple[str, int]]
) -> dict[str, list[tuple[float, float]]]:
    """Each request sent to both servers in turn, the first alternating. Per search: (request-
    level, continuous) latency pairs in seconds, of requests both answered with a 200."""
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in SEARCHES}
    names = {beam: name for name, beam in SEARCHES.items()}
    async with (
        client_session(urls[REQUEST], 1) as request,
        client_session(urls[CONTINUOUS], 1) as continuous,
    ):
        clients = {REQUEST: request, CONTINUOUS: continuous}
        for number, (text, beam) in enumerate(work):
            order = (REQUEST, CONTINUOUS) if number % 2 == 0 else (CONTINUOUS, REQUEST)
            latency: dict[str, float] = {}
            for name in order:
                timed: list[float] = []
                if await translate_once(clients[name], text, beam, timed):
                    latency[name] = timed[0]
            if len(latency) == 2:
                found[names[beam]].append((latency[REQUEST], latency[CONTINUOUS]))
    return found


def median_interval(ratios: list[float], rng: np.random.Generator) -> tuple[float, float]:
    """A 95% bootstrap interval of the median (2,000 resamples)."""
    values = np.asarray(ratios)
    medians = np.median(rng.choice(values, (2000, len(values))), axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(low), float(high)


def paired_summary(
    measured: list[tuple[float, float]], rng: np.random.Generator
) -> tuple[float, float, float, float, float]:
    """(request-level, continuous) seconds per pair -> each one's median in ms, the median
    of the ratios continuous / request-level, and that median's 95% interval."""
    ratios = [c / r for r, c in measured]
    low, high = median_interval(ratios, rng)
    request = statistics.median(r for r, _ in measured) * 1e3
    continuous = statistics.median(c for _, c in measured) * 1e3
    return request, continuous, statistics.median(ratios), low, high


def report(found: dict[str, list[tuple[float, float]]], setup: dict[str, str]) -> str:
    rng = np.random.default_rng(0)
    lines = opening(
        "Lone client: continuous vs request-level batching, request by request",
        "bench.lone_client",
        f"; engine threads: {setup['threads']}; translation cache off, other settings at "
        "their defaults",
    )
    lines += [
        f"- one client; every request (one sentence, {setup['sentences']}) sent to both "
        "servers one after the other, which goes first alternating; latency measured by the "
        "client; the ratio is continuous over request-level within each pair",
        "",
        "| search | pairs | request-level p50 ms | continuous p50 ms | median ratio "
        "| 95% interval of the median ratio |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, measured in found.items():
        if not measured:
            continue
        request, continuous, ratio, low, high = paired_summary(measured, rng)
        lines.append(
            f"| {name} | {len(measured)} | {request:.1f} | {continuous:.1f} "
            f"| {ratio:.3f}x | {low:.3f}x - {high:.3f}x |"
        )
    lines += ["", "What the numbers say: [service.md, Performance](service.md#performance)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="bundles folder (default: export one)")
    parser.add_argument("--sentences", type=Path, default=MULTI30K_TEST)
    parser.add_argument("--pairs", type=int, default=400, help="requests per search")
    parser.add_argument(
        "--threads", type=int, default=0, help="engine threads (0: the server's default)"
    )
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    sentences, source = load_sentences(args.sentences)
    threads = args.threads or max(1, (os.cpu_count() or 1) - 1)
    rng = random.Random(13)
    work = [(rng.choice(sentences), beam) for beam in SEARCHES.values() for _ in range(args.pairs)]
    rng.shuffle(work)
    with ExitStack() as stack:
        model_dir = ensure_bundles(args.model_dir, stack)
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nmt-bench-logs-")))
        urls = {
            name: stack.enter_context(
                server(model_dir, log_dir, {"batching": name, "threads": threads})
            ).url
            for name in (REQUEST, CONTINUOUS)
        }
        asyncio.run(pairs(urls, work[:20]))  # warm the connections and the shapes
        started = time.perf_counter()
        found = asyncio.run(pairs(urls, work))
        print(f"{len(work)} pairs in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    text = report(found, {"threads": str(threads), "sentences": source})
    replace_section("lone-client", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
