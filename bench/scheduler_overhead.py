"""The decoding loop's own work a turn: what it does around each decoder step.

    .venv/bin/python -m bench.scheduler_overhead --model-dir build/models

A lone client's request is a sentence decoded alone, so what the loop does around each decoder
step (looking at the queue, abandoned rows, deadlines, its reports) is what it costs that
request over a bare `search`. Sentences go one at a time through a DecodingLoop built
as the server builds it (ModelRegistry, the same settings and limits), driven by `work_once`
on this thread; per turn that steps, its time less the engine step's, as the loop itself
reports it to its observer (`observe_step`'s seconds: the product's hook, no wrapping of its
methods). Reported: median and mean (of the turns under the 99th percentile) in µs, with the
server's metrics behind the observer and without them (the observer only keeps the times).

Writes the "scheduler-overhead" section of docs/benchmarks.md. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.harness import temporary_bundles
from bench.load import MULTI30K_TEST, load_sentences
from bench.report import opening, replace_section
from service.runtime.running_batch import running_batch
from service.runtime.search import SearchOptions
from service.serving.loop import DecodingBatch, DecodingLoop
from service.serving.metrics import Metrics
from service.serving.observer import ModelLabels
from service.serving.registry import LoadedModel, ModelRegistry
from service.serving.settings import Settings

SEARCHES = {"greedy": 1, "beam 4": 4}
FAR = 3600.0  # a deadline nobody reaches


class StepTimes:
    """An observer of the loop that keeps each step's seconds and hands every report, steps
    included, on to `metrics` (the server's), or drops them without it."""

    def __init__(self, metrics: Metrics | None) -> None:
        self.seconds: list[float] = []
        self._metrics = metrics

    def observe_step(
        self,
        model: ModelLabels,
        sentences: int,
        rows: int,
        output_tokens: int,
        seconds: float,
    ) -> None:
        self.seconds.append(seconds)
        if self._metrics is not None:
            self._metrics.observe_step(model, sentences, rows, output_tokens, seconds)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """Every other report of the observer protocol: the server's, or nothing."""
        if name.startswith("_"):
            raise AttributeError(name)
        if self._metrics is not None:
            return getattr(self._metrics, name)
        return lambda *args, **kwargs: None


def load(model_dir: Path, threads: int) -> LoadedModel:
    registry = ModelRegistry(
        Settings(model_dir=model_dir, threads=threads, cache_entries=0), Metrics()
    )
    registry.load_all()
    return registry.models[0]


async def turn_overheads(
    model: LoadedModel, sources: list[list[int]], beam: int, metrics: Metrics | None
) -> list[float]:
    """Seconds of each stepping turn of `work_once` outside the engine step, decoding the
    sentences one at a time on this thread."""
    engine = model.translator.engine

    def new_batch(beams: int) -> DecodingBatch:
        return running_batch(engine, beams)

    steps = StepTimes(metrics)
    loop = DecodingLoop(model.labels, new_batch, model.loop.limits, steps, encode_ahead=False)
    options = SearchOptions(beam_size=beam)
    overheads: list[float] = []
    for source in sources:
        job = loop.submit([source], options, time.monotonic() + FAR)
        joining = True  # the first turn joins (encoder call and all): not a step's turn
        while True:
            stepped_before = len(steps.seconds)
            started = time.perf_counter()
            stepped = loop.work_once()
            seconds = time.perf_counter() - started
            if not stepped:
                break
            if not joining and len(steps.seconds) == stepped_before + 1:
                overheads.append(seconds - steps.seconds[-1])
            joining = False
        await job.future
    return overheads


def summary(overheads: list[float]) -> tuple[float, float]:
    """Median, and mean of those under the 99th percentile, in µs."""
    ordered = sorted(overheads)
    kept = ordered[: max(1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1e6, statistics.mean(kept) * 1e6


def report(turns: dict, setup: dict[str, str]) -> str:
    lines = opening(
        "The decoding loop's own work a turn",
        "bench.scheduler_overhead",
        f"; engine threads: {setup['threads']}; {setup['sentences']} sentences "
        f"{setup['source']}, one at a time",
    )
    lines += [
        "- turn: one turn of the loop (`work_once`) that steps, less the engine step (as the "
        "loop reports it to its observer); µs, median and mean (below the 99th percentile)",
        "",
        "| search | turn, with metrics: median / mean µs | turn, no metrics: median / mean µs |",
        "|---|---:|---:|",
    ]
    for name in SEARCHES:
        with_metrics, without = turns[name]
        lines.append(
            f"| {name} | {with_metrics[0]:.1f} / {with_metrics[1]:.1f} "
            f"| {without[0]:.1f} / {without[1]:.1f} |"
        )
    lines += [
        "",
        'What the numbers say: [service.md, "The scheduler\'s own work a step"]'
        "(service.md#the-schedulers-own-work-a-step).",
    ]
    return "\n".join(lines) + "\n"


async def measure(model: LoadedModel, sources: list[list[int]]) -> dict:
    turns = {}
    for name, beam in SEARCHES.items():
        with_metrics = await turn_overheads(model, sources, beam, Metrics())
        without = await turn_overheads(model, sources, beam, None)
        turns[name] = (summary(with_metrics), summary(without))
        print(f"{name}: turn {turns[name]}", file=sys.stderr)
    return turns


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
        model = load(args.model_dir or temporary_bundles(stack), args.threads)
        stack.callback(model.loop.close)
        tokenizer = model.translator.tokenizer
        sources = tokenizer.encode((texts * (args.count // len(texts) + 1))[: args.count])
        turns = asyncio.run(measure(model, sources))
    setup = {"threads": str(args.threads), "sentences": str(len(sources)), "source": source}
    text = report(turns, setup)
    print(text)
    replace_section("scheduler-overhead", text, args.out)


if __name__ == "__main__":
    main()
