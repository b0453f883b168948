"""A greedy and a beam batch: one decoder step each, against one step of both together.

    .venv/bin/python -m bench.step_together --model-dir build/models

For each size (greedy sentences + beam sentences), both batches are filled with sentences of
Multi30k's test set (or a built-in list), run a few steps, and then take `--steps` more steps,
apart (two engine calls a step) or together (`step_together`: one call), in turns, on fresh
batches each time: a slow spell of the machine falls on both. The first step together stacks
the batches' caches; the next ones go on from it while nobody joins or leaves. Prints a
markdown table of the medians (per step) and their ratio. This is how STEP_TOGETHER_ROWS
(service/serving/loop.py) was chosen.
A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

from bench.harness import temporary_bundles
from bench.load import MULTI30K_TEST, load_sentences
from service.runtime.bundle import load_bundle
from service.runtime.running_batch import RunningBatch, Sentence, running_batch, step_together
from service.runtime.search import SearchOptions
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator
from service.serving.registry import find_bundles

SIZES = [(1, 1), (2, 2), (4, 2), (4, 4), (8, 4), (16, 4), (16, 8), (32, 8), (32, 16)]
WARM_STEPS = 6  # caches of a few positions, as in a running batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="bundles folder (default: export one)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--turns", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4, help="steps timed in a row")
    args = parser.parse_args()

    with ExitStack() as stack:
        model_dir = args.model_dir or temporary_bundles(stack)
        options = EngineOptions(intra_op_threads=args.threads, spinning=False)
        translator = Translator(load_bundle(find_bundles(model_dir)[0]), options)
    texts, source = load_sentences(MULTI30K_TEST)
    # The longest: none may end within the steps measured.
    sources = sorted(translator.tokenizer.encode(texts), key=len, reverse=True)[:64]
    # Long limits: no sentence may end in the steps measured.
    greedy_options = SearchOptions(max_length=300)
    beam_options = SearchOptions(beam_size=args.beam, max_length=300)

    def batches(greedy: int, beams: int) -> list[RunningBatch]:
        made = [running_batch(translator.engine, 1), running_batch(translator.engine, args.beam)]
        made[0].join([Sentence(s, greedy_options) for s in sources[:greedy]])
        made[1].join([Sentence(s, beam_options) for s in sources[greedy : greedy + beams]])
        for _ in range(WARM_STEPS):
            for batch in made:
                batch.step()
        return made

    def timed(greedy: int, beams: int, together: bool) -> float | None:
        made = batches(greedy, beams)
        if [len(batch) for batch in made] != [greedy, beams]:
            return None  # a sentence ended while warming up: not this size
        started = time.perf_counter()
        for _ in range(args.steps):
            if together:
                step_together(made)
            else:
                for batch in made:
                    batch.step()
        seconds = time.perf_counter() - started
        if [len(batch) for batch in made] != [greedy, beams]:
            return None  # a sentence ended while timed: a leave, not a step
        return seconds / args.steps

    print(
        f"sentences {source}; {args.threads} thread(s); {args.steps} steps in a row; "
        f"medians of {args.turns} turns"
    )
    print("| greedy + beam sentences | rows | apart, ms a step | together, ms a step | ratio |")
    print("|---|---:|---:|---:|---:|")
    for greedy, beams in SIZES:
        apart, together = [], []
        for _ in range(args.turns):
            for into, flag in ((apart, False), (together, True)):
                seconds = timed(greedy, beams, flag)
                if seconds is not None:
                    into.append(seconds)
        if not apart or not together:
            continue
        a, t = statistics.median(apart), statistics.median(together)
        rows = greedy + args.beam * beams
        print(f"| {greedy} + {beams} | {rows} | {a * 1e3:.2f} | {t * 1e3:.2f} | {t / a:.2f}x |")


if __name__ == "__main__":
    main()
