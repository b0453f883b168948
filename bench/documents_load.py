"""Interactive latency with and without a large document being translated at the same time.

A document's sentences are background work (service/serving/queue.py): they join a running
batch only in the room interactive requests leave. This measures what that buys a person
waiting for a translation: one server, closed-loop clients sending /v1/translate requests, in
rounds that alternate between "alone" and "beside a document" (a Word file of many paragraphs
uploaded through DeepL's /v2/document just before the round, still translating when the round
ends: the report says so per round). Between rounds the document is let finish.

    .venv/bin/python -m bench.documents_load [--rounds 6] [--clients 4] [--seconds 20]

Writes the `documents-load` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import aiohttp
import docx
import httpx

from bench.harness import ensure_bundle, running_server
from bench.load import client_session, load_sentences, percentile, translate_once
from bench.report import machine, replace_section, reproduce

MULTI30K = Path("../shared/data/multi30k/test_2016_flickr.fr")


def word_file(paragraphs: list[str]) -> bytes:
    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


async def timed_clients(url: str, texts: list[str], clients: int, seconds: float) -> list[float]:
    """`clients` clients, each sending its next request when answered, for `seconds`."""
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds
    next_text = iter(texts * 1000)

    async def client_loop(client: aiohttp.ClientSession) -> None:
        while time.perf_counter() < stop_at:
            await translate_once(client, next(next_text), 4, latencies)

    async with client_session(url, clients) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    return latencies


def status(url: str, handle: dict) -> dict:
    return httpx.post(
        f"{url}/v2/document/{handle['document_id']}",
        json={"document_key": handle["document_key"]},
        timeout=30,
    ).json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each kind")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of a round")
    parser.add_argument("--paragraphs", type=int, default=1500, help="of the document")
    parser.add_argument(
        "--chunk", type=int, default=0, help="NMT_DOCUMENT_CHUNK_SENTENCES (0: the default)"
    )
    args = parser.parse_args()
    texts, source = load_sentences(MULTI30K)
    document = word_file([texts[i % len(texts)] for i in range(args.paragraphs)])
    alone: list[list[float]] = []
    beside: list[list[float]] = []
    still_running: list[bool] = []
    document_rates: list[float] = []
    with ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        state = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        server = stack.enter_context(
            # The cache off: the sentences repeat, and a cached answer skips the queue.
            running_server(
                ensure_bundle(),
                logs,
                state_dir=state,
                document_poll_seconds=0.2,
                cache_entries=0,
                **({"document_chunk_sentences": args.chunk} if args.chunk else {}),
            )
        )
        asyncio.run(timed_clients(server.url, texts, args.clients, 5))  # warm up
        for round_number in range(args.rounds):
            alone.append(asyncio.run(timed_clients(server.url, texts, args.clients, args.seconds)))
            handle = httpx.post(
                f"{server.url}/v2/document",
                data={"target_lang": "EN-US", "source_lang": "FR"},
                files={"file": ("big.docx", document)},
                timeout=60,
            ).json()
            while status(server.url, handle)["status"] == "queued":
                time.sleep(0.05)
            started = time.perf_counter()
            beside.append(asyncio.run(timed_clients(server.url, texts, args.clients, args.seconds)))
            still_running.append(status(server.url, handle)["status"] == "translating")
            while (found := status(server.url, handle))["status"] not in ("done", "error"):
                time.sleep(0.2)
            characters = found.get("billed_characters") or 0
            document_rates.append(characters / (time.perf_counter() - started))
            print(
                f"round {round_number + 1}: alone p99 {percentile(alone[-1], 0.99) * 1000:.0f} ms,"
                f" beside p99 {percentile(beside[-1], 0.99) * 1000:.0f} ms",
                flush=True,
            )

    def row(name: str, parts: list[list[float]]) -> str:
        every = [latency for part in parts for latency in part]
        p50 = statistics.median(percentile(part, 0.5) for part in parts) * 1000
        p99 = statistics.median(percentile(part, 0.99) for part in parts) * 1000
        rate = statistics.median(len(part) / args.seconds for part in parts)
        return f"| {name} | {len(every)} | {rate:.1f} | {p50:.0f} | {p99:.0f} |"

    p99_ratio = statistics.median(
        percentile(b, 0.99) / percentile(a, 0.99) for a, b in zip(alone, beside, strict=True)
    )
    report = "\n".join(
        [
            "## Interactive latency beside a document",
            "",
            f"Measured on {machine()}. {args.clients} closed-loop clients, beam 4, sentences "
            f"{source}, translation cache off; {args.rounds} rounds of {args.seconds:g} s of "
            "each kind, alternating. "
            f"The document: a Word file of {args.paragraphs} paragraphs (the same sentences), "
            "uploaded through /v2/document before each 'beside' round; "
            f"NMT_DOCUMENT_CHUNK_SENTENCES {args.chunk or 'at its default'}. Medians over rounds.",
            "",
            "| interactive requests | answered | requests/s | p50 ms | p99 ms |",
            "|---|---|---|---|---|",
            row("alone", alone),
            row("beside a document", beside),
            "",
            f"p99 beside / alone, median of the per-round ratios: {p99_ratio:.2f}x. "
            f"The document was still translating at the end of {sum(still_running)} of "
            f"{len(still_running)} rounds; it was translated at a median "
            f"{statistics.median(document_rates):.0f} characters/s while the clients ran.",
            "",
            f"Reproduce: `{reproduce('bench.documents_load')}`",
        ]
    )
    replace_section("documents-load", report)
    print(report)


if __name__ == "__main__":
    main()
