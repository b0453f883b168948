"""The continuous scheduler's own work a turn, and a lone sentence through both schedulers.

    .venv/bin/python -m bench.scheduler_overhead --model-dir build/models

A lone client's request is a sentence decoded alone, so what the scheduler does around each
decoder step is what continuous batching costs it over request-level batching (whose loop is
`search`, with one check for abandoned rows a step). Two measurements, in one process, with
the schedulers built as the server builds them (ModelRegistry, the same settings and metrics):

* **The turn**: sentences one at a time through a ContinuousScheduler driven by `work_once`
  on this thread; per turn that steps, its time less the engine step's (the step is the
  RunningBatch's, as in `search`). Reported: median and mean (of the turns under the 99th
  percentile) in µs, with the server's metrics and without.
* **A lone sentence**: both servers' schedulers with their worker threads (and continuous
  batching's encoder thread, as NMT_ENCODE_AHEAD=auto sets it), every sentence submitted to
  one, awaited, then to the other, which goes first alternating; the ratio continuous over
  request-level within each pair, its median and a 95% bootstrap interval of the median.
  HTTP is left out: `bench.lone_client` measures the same through the servers.

Writes the "scheduler-overhead" section of docs/benchmarks.md. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from bench.lone_client import paired_summary
from bench.report import opening, replace_section
from bench.service_bench import MULTI30K_TEST, ensure_bundles, load_sentences
from service.runtime.running_batch import RunningBatch, SearchOptions, running_batch
from service.serving.continuous import ContinuousScheduler
from service.serving.metrics import Metrics
from service.serving.registry import LoadedModel, ModelRegistry
from service.serving.settings import Settings

SEARCHES = {"greedy": 1, "beam 4": 4}
FAR = 3600.0  # a deadline nobody reaches


def load(model_dir: Path, batching: str, threads: int) -> LoadedModel:
    registry = ModelRegistry(
        Settings(model_dir=model_dir, batching=batching, threads=threads, cache_entries=0),
        Metrics(),
    )
    registry.load_all()
    return registry.models[0]


async def turn_overheads(
    model: LoadedModel, sources: list[list[int]], beam: int, metrics: Metrics | None
) -> list[float]:
    """Seconds of each stepping turn of `work_once` outside the engine step, decoding the
    sentences one at a time on this thread."""
    step_seconds: list[float] = []

    def timed_batch(beams: int) -> RunningBatch:
        batch = running_batch(model.translator.engine, beams)
        step = batch.step

        def timed_step() -> list:
            started = time.perf_counter()
            finished = step()
            step_seconds.append(time.perf_counter() - started)
            return finished

        batch.step = timed_step  # type: ignore[method-assign]
        return batch

    scheduler = ContinuousScheduler(
        model.name, timed_batch, model.scheduler.limits, metrics, encode_ahead=False
    )
    options = SearchOptions(beam_size=beam)
    overheads: list[float] = []
    for source in sources:
        job = scheduler.submit([source], options, time.monotonic() + FAR)
        joining = True  # the first turn joins (encoder call and all): not a step's turn
        while True:
            steps = len(step_seconds)
            started = time.perf_counter()
            stepped = scheduler.work_once()
            seconds = time.perf_counter() - started
            if not stepped:
                break
            if not joining and len(step_seconds) == steps + 1:
                overheads.append(seconds - step_seconds[-1])
            joining = False
        await job.future
    return overheads


async def lone_pairs(
    models: dict[str, LoadedModel], sources: list[list[int]], beam: int
) -> list[tuple[float, float]]:
    """(request-level, continuous) seconds from submit to answer, per sentence."""
    options = SearchOptions(beam_size=beam)
    found = []
    for number, source in enumerate(sources):
        order = ("request", "continuous") if number % 2 == 0 else ("continuous", "request")
        seconds = {}
        for name in order:
            started = time.perf_counter()
            job = models[name].scheduler.submit([source], options, time.monotonic() + FAR)
            await job.future
            seconds[name] = time.perf_counter() - started
        found.append((seconds["request"], seconds["continuous"]))
    return found


def summary(overheads: list[float]) -> tuple[float, float]:
    """Median, and mean of those under the 99th percentile, in µs."""
    ordered = sorted(overheads)
    kept = ordered[: max(1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1e6, statistics.mean(kept) * 1e6


def report(turns: dict, pairs: dict, setup: dict[str, str]) -> str:
    rng = np.random.default_rng(0)
    lines = opening(
        "The continuous scheduler's own work, and a lone sentence in process",
        "bench.scheduler_overhead",
        f"; engine threads: {setup['threads']}; {setup['sentences']} sentences "
        f"{setup['source']}, one at a time",
    )
    lines += [
        "- turn: one turn of the continuous loop (`work_once`) that steps, less the engine "
        "step; µs, median and mean (below the 99th percentile)",
        "- lone sentence: submitted to one scheduler and awaited, then to the other (first "
        "one alternating); ratio continuous over request-level within each pair",
        "",
        "| search | turn, with metrics: median / mean µs | turn, no metrics: median / mean µs "
        "| request-level p50 ms | continuous p50 ms | median ratio | 95% interval |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name in SEARCHES:
        with_metrics, without = turns[name]
        request, continuous, ratio, low, high = paired_summary(pairs[name], rng)
        lines.append(
            f"| {name} | {with_metrics[0]:.1f} / {with_metrics[1]:.1f} "
            f"| {without[0]:.1f} / {without[1]:.1f} | {request:.2f} | {continuous:.2f} "
            f"| {ratio:.3f}x | {low:.3f}x - {high:.3f}x |"
        )
    lines += [
        "",
        'What the numbers say: [service.md, "The scheduler\'s own work a step"]'
        "(service.md#the-schedulers-own-work-a-step).",
    ]
    return "\n".join(lines) + "\n"


async def measure(models: dict[str, LoadedModel], sources: list[list[int]]) -> tuple:
    turns, pairs = {}, {}
    continuous = models["continuous"]
    for name, beam in SEARCHES.items():
        with_metrics = await turn_overheads(continuous, sources, beam, Metrics())
        without = await turn_overheads(continuous, sources, beam, None)
        turns[name] = (summary(with_metrics), summary(without))
        pairs[name] = await lone_pairs(models, sources, beam)
        print(f"{name}: turn {turns[name]}", file=sys.stderr)
    return turns, pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="bundles folder (default: export one)")
    parser.add_argument("--sentences", type=Path, default=MULTI30K_TEST)
    parser.add_argument("--count", type=int, default=300, help="sentences per search")
    parser.add_argument("--threads", type=int, default=1, help="engine threads")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    texts, source = load_sentences(args.sentences)
    with ExitStack() as stack:
        model_dir = ensure_bundles(args.model_dir, stack)
        models = {name: load(model_dir, name, args.threads) for name in ("request", "continuous")}
        for model in models.values():
            stack.callback(model.scheduler.close)
        tokenizer = models["request"].translator.tokenizer
        sources = tokenizer.encode((texts * (args.count // len(texts) + 1))[: args.count])
        turns, pairs = asyncio.run(measure(models, sources))
    setup = {"threads": str(args.threads), "sentences": str(len(sources)), "source": source}
    text = report(turns, pairs, setup)
    print(text)
    replace_section("scheduler-overhead", text, args.out)


if __name__ == "__main__":
    main()
