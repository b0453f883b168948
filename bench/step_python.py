"""Python time a decoder step: a search's wall time less ONNX Runtime's, for code trees in turns.

    python -m bench.step_python --trees /tmp/base . --runs 5   # (git worktree add /tmp/base REV)

Each tree (a checkout of this repository: its `service/` is what is measured) runs in a
process of its own, one after the other, `--runs` times over (A B A B ...: a slow spell of
the machine falls on all of them). A run translates the first `--sentences` lines of
`--text` (test_2016_flickr.fr, from beside this checkout, the same file for every tree) with
`search()` on the bundle of `--model-dir` (int8 unless `--fp32`, one thread), one at a time
and in two batches of 32 sorted by length, for greedy and beam 4, with and without the
repetition guard (the server's default is 3), and counts the time outside every encoder and
decoder session call, per decoder step. Prints a markdown table of the medians over runs,
and each tree's ratio to the first. This is how "Less Python a step" in docs/performance.md
was measured.
A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MULTI30K_TEST = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k" / "test_2016_flickr.fr"
)
CASES = [(4, 3), (4, 0), (1, 3), (1, 0)]  # (beam size, repetition guard)
PASSES = 5  # timed passes a case within one run (their median)


def measure(model_dir: Path, int8: bool, text: Path, sentences: int) -> dict[str, float]:
    """In this process (the tree on sys.path): Python µs a decoder step, per case, on the
    first `sentences` lines of `text`."""
    from service.runtime.bundle import load_bundle
    from service.runtime.engine import EngineOptions
    from service.runtime.search import SearchOptions, search
    from service.runtime.translator import Translator
    from service.serving.registry import find_bundles

    options = EngineOptions(intra_op_threads=1, spinning=False, int8=int8)
    translator = Translator(load_bundle(find_bundles(model_dir)[0]), options)
    in_runtime = {"seconds": 0.0, "steps": 0}
    for session, counts in ((translator.engine.decoder, 1), (translator.engine.encoder, 0)):
        run = session.run

        def timed(*args, run=run, counts=counts, **kwargs):
            started = time.perf_counter()
            outputs = run(*args, **kwargs)
            in_runtime["seconds"] += time.perf_counter() - started
            in_runtime["steps"] += counts
            return outputs

        session.run = timed
    texts = text.read_text(encoding="utf-8").splitlines()[:sentences]
    sources = translator.tokenizer.encode(texts)
    by_length = sorted(sources, key=len)
    groups = {
        "batch 1": [[source] for source in sources],
        "batch 32": [by_length[i : i + 32] for i in range(0, len(by_length), 32)],
    }
    found = {}
    for beam, repeats in CASES:
        search_options = SearchOptions(beam_size=beam, max_repeats=repeats)
        search(translator.engine, sources[:2], search_options)  # warm
        for batching, batches in groups.items():
            per_step = []
            for _ in range(PASSES):
                in_runtime.update(seconds=0.0, steps=0)
                started = time.perf_counter()
                for batch in batches:
                    search(translator.engine, batch, search_options)
                outside = time.perf_counter() - started - in_runtime["seconds"]
                per_step.append(outside / in_runtime["steps"] * 1e6)
            name = "greedy" if beam == 1 else f"beam {beam}"
            found[f"{name}, {batching}, repetition guard {repeats}"] = statistics.median(per_step)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=Path, nargs="+", default=[Path(".")])
    parser.add_argument("--model-dir", type=Path, default=Path("build/models"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=32)
    parser.add_argument("--fp32", action="store_true")
    parser.add_argument("--text", type=Path, default=MULTI30K_TEST, help="source sentences")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:  # run from inside the tree: its service/ is imported
        print(json.dumps(measure(args.model_dir, not args.fp32, args.text, args.sentences)))
        return
    if not args.text.is_file():  # every tree gets this file: no tree may fall back to another
        sys.exit(f"{args.text} not found (Multi30k's test set; or give --text)")

    model_dir = args.model_dir.resolve()
    runs: dict[Path, list[dict[str, float]]] = {tree: [] for tree in args.trees}
    for _ in range(args.runs):
        for tree in args.trees:
            # This file runs in every tree (an older one may not have it), ahead of its code.
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                "--model-dir",
                str(model_dir),
            ]
            command += ["--text", str(args.text.resolve()), "--sentences", str(args.sentences)] + (
                ["--fp32"] if args.fp32 else []
            )
            environment = {**os.environ, "PYTHONPATH": str(tree.resolve())}
            done = subprocess.run(
                command, cwd=tree, env=environment, capture_output=True, text=True, check=True
            )
            runs[tree].append(json.loads(done.stdout.splitlines()[-1]))
    first = args.trees[0]
    header = " | ".join(f"`{tree}` (µs)" for tree in args.trees)
    ratios = " | ".join(f"`{tree}` / `{first}`" for tree in args.trees[1:])
    print(f"| search | {header} | {ratios} |")
    print("|---|" + "---:|" * (2 * len(args.trees) - 1))
    for case in runs[first][0]:
        medians = [statistics.median(run[case] for run in runs[tree]) for tree in args.trees]
        cells = " | ".join(f"{value:.0f}" for value in medians)
        against = " | ".join(f"{value / medians[0]:.2f}" for value in medians[1:])
        print(f"| {case} | {cells} | {against} |")


if __name__ == "__main__":
    main()
