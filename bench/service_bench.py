"""Service throughput and latency, dynamic batching on vs off, side by side in one run.

    nice -n 10 .venv/bin/python -m bench.service_bench

Starts three `nmt serve` processes on free loopback ports (all serving the same bundles: the
committed checkpoint, exported to a temporary folder, unless --model-dir is given): two batch
(NMT_MAX_BATCH_WAIT_MS=5 and 0) and one has NMT_MAX_BATCH_SIZE=1, every sentence decoded alone.
For each beam size and 1, 8 and 32 concurrent clients it sends each server the same bounded set
of one-sentence requests (Multi30k test sentences when they are there) with httpx async clients.
The work alternates between the servers in halves, in mirrored order (A, B, C, C, B, A), so
that a change in background load hits all alike. Before that, it times the engine alone, in
process, on the same sentences at batch sizes 1, 8 and 32: the ceiling that batching in the
service can reach.
Writes the "service" section of docs/benchmarks.md.

A benchmark, not a test: it reports what it measured and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.report import replace_section

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "benchmarks.md"
SERVE = [sys.executable, "-m", "nmt_cli", "serve"]
MULTI30K_TEST = ROOT.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.fr"
FALLBACK_SENTENCES = [
    "Un homme en chemise bleue marche dans la rue.",
    "Deux enfants jouent au ballon sur la plage.",
    "Une femme lit un livre dans un parc.",
    "Le chien court après la balle.",
    "Un groupe de personnes attend le bus devant une grande gare.",
    "Une petite fille mange une glace.",
    "Un homme fait du vélo sur une route de montagne.",
    "Des gens sont assis à une table dans un restaurant.",
]
# Servers compared side by side: batching (the default batch size) with two waits, and none.
WAIT, NO_WAIT, OFF = "wait 5 ms", "no wait", "off"
CONFIGURATIONS = {
    WAIT: {"max_batch_wait_ms": 5},
    NO_WAIT: {"max_batch_wait_ms": 0},
    OFF: {"max_batch_size": 1},
}
ENGINE_BATCHES = (1, 8, 32)


@dataclass
class Run:
    beam: int
    clients: int
    batching: str
    requests: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    sentences: float = 0.0
    batches: float = 0.0
    errors: int = 0

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds

    @property
    def mean_batch(self) -> float:
        return self.sentences / self.batches if self.batches else float("nan")

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def server(model_dir: Path, log_dir: Path, settings: dict[str, object]) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "NMT_MODEL_DIR": str(model_dir),
        "NMT_HOST": "127.0.0.1",
        "NMT_PORT": str(port),
        "NMT_ACCESS_LOG": "false",
        # The clients repeat their sentences: the cache would answer them, not the batching.
        "NMT_CACHE_ENTRIES": "0",
        **{f"NMT_{name.upper()}": str(value) for name, value in settings.items()},
    }
    log_path = log_dir / f"server-{port}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(SERVE, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server did not start:\n{log_path.read_text()}")
            time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def batch_totals(url: str) -> tuple[float, float]:
    """(batches, sentences) the server has decoded so far, from its Prometheus metrics."""
    batches = sentences = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name == "nmt_batch_sentences_count":
                batches += sample.value
            elif sample.name == "nmt_batch_sentences_sum":
                sentences += sample.value
    return batches, sentences


async def load(
    url: str, sentences: list[str], clients: int, requests: int, beam: int
) -> tuple[list[float], int, float]:
    """`clients` concurrent clients share `requests` requests, each sending its next one when
    the previous is answered; returns the latencies, the errors and the wall time."""
    todo = iter(range(requests))
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal errors
        for index in todo:
            payload = {
                "text": sentences[index % len(sentences)],
                "source_lang": "fr",
                "target_lang": "en",
                "beam_size": beam,
            }
            started = time.perf_counter()
            response = await client.post("/v1/translate", json=payload)
            latencies.append(time.perf_counter() - started)
            errors += response.status_code != 200

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=300) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        return latencies, errors, time.perf_counter() - started


def measure(run: Run, url: str, sentences: list[str], requests: int) -> None:
    """Add one bounded load to `run`."""
    batches_before, sentences_before = batch_totals(url)
    latencies, errors, seconds = asyncio.run(load(url, sentences, run.clients, requests, run.beam))
    batches_after, sentences_after = batch_totals(url)
    run.requests += requests
    run.seconds += seconds
    run.latencies += latencies
    run.errors += errors
    run.batches += batches_after - batches_before
    run.sentences += sentences_after - sentences_before


def engine_ceiling(model_dir: Path, sentences: list[str], beams: list[int]) -> list[str]:
    """Sentences per second of the engine alone at a few batch sizes: what batching can buy."""
    from service.runtime.bundle import load_bundle
    from service.runtime.engine import EngineOptions
    from service.runtime.search import SearchOptions
    from service.runtime.translator import Translator
    from service.serving.registry import find_bundles

    translator = Translator(load_bundle(find_bundles(model_dir)[0]), EngineOptions())
    sources = translator.tokenizer.encode(sentences[:32])
    rows = []
    for beam in beams:
        options = SearchOptions(beam_size=beam)
        translator.translate_ids(sources[:8], options, 8)  # warm-up
        speeds = []
        for batch in ENGINE_BATCHES:
            started = time.perf_counter()
            translator.translate_ids(sources, options, batch)
            speeds.append(len(sources) / (time.perf_counter() - started))
        cells = " | ".join(f"{s:.1f}" for s in speeds)
        rows.append(f"| {beam} | {cells} | {speeds[-1] / speeds[0]:.2f}x |")
        print(f"engine alone, beam {beam}: {cells} sentences/s", file=sys.stderr)
    return rows


def _default(name: str):
    from service.serving.settings import Settings

    return Settings.model_fields[name].default


def report(
    runs: list[Run], engine_rows: list[str], model: str, load_avg: str, sentences: str
) -> str:
    command = "nice -n 10 .venv/bin/python -m bench.service_bench"
    if sys.argv[1:]:
        command += " " + shlex.join(sys.argv[1:])
    batch_header = " | ".join(f"batch {b}" for b in ENGINE_BATCHES)
    lines = [
        "## Service: dynamic batching, with and without a wait, vs off",
        "",
        f"Reproduce: `{command}`",
        "",
        f"- when: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, load average before the run {load_avg}",
        f"- model: {model}; ONNX Runtime threads: one per core (NMT_THREADS default)",
        f"- requests: one sentence each, {sentences}; each client sends its next request when "
        "the previous one is answered",
        f"- batching: NMT_MAX_BATCH_SIZE={_default('max_batch_size')} (the default) with "
        "NMT_MAX_BATCH_WAIT_MS=5 ('wait 5 ms': sentences wait that long for companions, except "
        "after a batch of one) "
        f"or 0 ('no wait'; the default is {_default('max_batch_wait_ms'):g}); "
        "off: NMT_MAX_BATCH_SIZE=1",
        "- latency per request, measured by the client; throughput in requests per second of "
        "wall time; mean batch: sentences per engine batch, from the server's "
        "nmt_batch_sentences histogram",
        "",
        "| beam | clients | batching | requests | req/s | p50 ms | p99 ms | mean batch | "
        "req/s vs off |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    off = {(r.beam, r.clients): r for r in runs if r.batching == OFF}
    for run in runs:
        ratio = run.throughput / off[run.beam, run.clients].throughput
        errors = f" ({run.errors} errors)" if run.errors else ""
        lines.append(
            f"| {run.beam} | {run.clients} | {run.batching} | {run.requests}{errors} | "
            f"{run.throughput:.1f} | {run.percentile(0.5) * 1000:.0f} | "
            f"{run.percentile(0.99) * 1000:.0f} | {run.mean_batch:.1f} | "
            + (f"{ratio:.2f}x |" if run.batching != OFF else "|")
        )
    lines += [
        "",
        "The engine alone (in process, no HTTP), sentences per second on 32 of the same "
        "sentences, by batch size: the most that batching in the service can buy.",
        "",
        f"| beam | {batch_header} | batch {ENGINE_BATCHES[-1]} / batch 1 |",
        "|---:|" + "---:|" * (len(ENGINE_BATCHES) + 1),
        *engine_rows,
        "",
        "What the numbers say, and why batching buys more for greedy than for beam search: "
        "[service.md, Performance](service.md#performance).",
    ]
    return "\n".join(lines) + "\n"


def ensure_bundles(model_dir: Path | None, stack: ExitStack) -> Path:
    """The given bundles folder, or the committed checkpoint exported to a temporary one."""
    if model_dir is not None:
        return model_dir
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nmt-bench-")))
    print("exporting models/fr-en to a temporary bundle…", file=sys.stderr)
    subprocess.run(
        [sys.executable, "-m", "nmt_cli", "export", "--out", str(folder / "fr-en")],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="bundles folder (default: export one)")
    parser.add_argument("--sentences", type=Path, default=MULTI30K_TEST)
    parser.add_argument("--beam-sizes", default="4,1", help="comma-separated beam sizes")
    parser.add_argument("--clients", default="1,8,32", help="comma-separated client counts")
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--min-requests", type=int, default=24)
    parser.add_argument("--out", type=Path, default=REPORT)
    args = parser.parse_args()

    if args.sentences.is_file():
        sentences = args.sentences.read_text(encoding="utf-8").splitlines()[:500]
        source = f"from {args.sentences.name}"
    else:
        sentences, source = FALLBACK_SENTENCES, "from a built-in list (Multi30k not found)"
    beams = [int(b) for b in args.beam_sizes.split(",")]
    load_avg = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    runs: list[Run] = []
    with ExitStack() as stack:
        model_dir = ensure_bundles(args.model_dir, stack)
        engine_rows = engine_ceiling(model_dir, sentences, beams)
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nmt-bench-logs-")))
        urls = {
            name: stack.enter_context(server(model_dir, log_dir, settings))
            for name, settings in CONFIGURATIONS.items()
        }
        model = ", ".join(
            f"{m['name']} ({m['precision']})"
            for m in httpx.get(f"{urls[OFF]}/v1/models").json()["models"]
        )
        for beam in beams:
            for clients in (int(c) for c in args.clients.split(",")):
                requests = max(args.min_requests, args.requests_per_client * clients)
                level = {name: Run(beam, clients, name) for name in urls}
                for url in urls.values():  # warm the connections and the shapes
                    asyncio.run(load(url, sentences, clients, min(clients, 8), beam))
                # halves, in mirrored order, so that drifting load hits all alike
                for name in [*CONFIGURATIONS, *reversed(CONFIGURATIONS)]:
                    measure(level[name], urls[name], sentences, requests // 2)
                for run in level.values():
                    runs.append(run)
                    print(
                        f"beam {beam}, {clients:>2} clients, batching {run.batching:>3}: "
                        f"{run.throughput:.1f} req/s, p50 {run.percentile(0.5) * 1000:.0f} ms, "
                        f"mean batch {run.mean_batch:.1f}",
                        file=sys.stderr,
                    )
    text = report(runs, engine_rows, model, load_avg, source)
    replace_section("service", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
