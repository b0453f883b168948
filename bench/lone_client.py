"""A lone client, two servers, request by request: A over B within each pair.

    .venv/bin/python -m bench.lone_client --model-dir build/models --b-tree /tmp/before

A lone client's latency moves by a few percent with a change to the decoding loop, and
service_bench's closed loop at one client plays rounds of a few seconds on each server in turn,
while this machine's speed drifts by a fifth within a minute: its round-by-round ratios spread
from 0.75x to 1.34x, too wide to tell a few percent. Here every request is sent to both
servers, one right after the other (which goes first alternates), and the ratio is taken
within each pair, milliseconds apart: drift falls out of it. The servers differ in their
settings (`--a`, `--b`: NAME=VALUE) or in the checkout they run from (`--a-tree`, `--b-tree`,
e.g. `git worktree add /tmp/before HEAD`: before and after a change). Reported per search
(greedy, beam 4): the median latency of each server, the median of the per-pair ratios and a
95% bootstrap interval of that median.

Both servers run with the translation cache off (the sentences repeat). Writes the
"lone-client" section of docs/benchmarks.md. A benchmark, not a test: it asserts nothing.
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

from bench.harness import ROOT, described, running_server, temporary_bundles
from bench.load import (
    MULTI30K_TEST,
    SERVED,
    client_session,
    load_sentences,
    settings,
    translate_once,
)
from bench.report import opening, replace_section

SEARCHES = {"greedy": 1, "beam 4": 4}


async def pairs(
    urls: dict[str, str], work: list[tuple[str, int]]
) -> dict[str, list[tuple[float, float]]]:
    """Each request sent to both servers in turn, the first alternating. Per search: (B, A)
    latency pairs in seconds, of requests both answered with a 200."""
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in SEARCHES}
    names = {beam: name for name, beam in SEARCHES.items()}
    async with client_session(urls["A"], 1) as a, client_session(urls["B"], 1) as b:
        clients = {"A": a, "B": b}
        for number, (text, beam) in enumerate(work):
            order = ("B", "A") if number % 2 == 0 else ("A", "B")
            latency: dict[str, float] = {}
            for name in order:
                timed: list[float] = []
                if await translate_once(clients[name], text, beam, timed):
                    latency[name] = timed[0]
            if len(latency) == 2:
                found[names[beam]].append((latency["B"], latency["A"]))
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
    """(B, A) seconds per pair -> each one's median in ms, the median of the ratios A / B, and
    that median's 95% interval."""
    ratios = [a / b for b, a in measured]
    low, high = median_interval(ratios, rng)
    b_median = statistics.median(b for b, _ in measured) * 1e3
    a_median = statistics.median(a for _, a in measured) * 1e3
    return b_median, a_median, statistics.median(ratios), low, high


def report(found: dict[str, list[tuple[float, float]]], setup: dict[str, str]) -> str:
    rng = np.random.default_rng(0)
    lines = opening(
        "Lone client: two servers, request by request",
        "bench.lone_client",
        f"; engine threads: {setup['threads']}; translation cache off",
    )
    lines += [
        f"- A: {setup['A']}; B: {setup['B']}",
        f"- one client; every request (one sentence, {setup['sentences']}) sent to both "
        "servers one after the other, which goes first alternating; latency measured by the "
        "client; the ratio is A over B within each pair",
        "",
        "| search | pairs | B p50 ms | A p50 ms | median ratio A / B "
        "| 95% interval of the median ratio |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, measured in found.items():
        if not measured:
            continue
        b_median, a_median, ratio, low, high = paired_summary(measured, rng)
        lines.append(
            f"| {name} | {len(measured)} | {b_median:.1f} | {a_median:.1f} "
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
    parser.add_argument("--a", nargs="*", default=[], help="NAME=VALUE settings of server A")
    parser.add_argument("--b", nargs="*", default=[], help="NAME=VALUE settings of server B")
    parser.add_argument("--a-tree", type=Path, help="checkout server A runs from (default: this)")
    parser.add_argument("--b-tree", type=Path, help="checkout server B runs from (default: this)")
    parser.add_argument(
        "--b-model-dir",
        type=Path,
        help="server B's bundles, where its checkout reads another bundle format "
        "(default: --model-dir)",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    sentences, source = load_sentences(args.sentences)
    threads = args.threads or max(1, (os.cpu_count() or 1) - 1)
    rng = random.Random(13)
    work = [(rng.choice(sentences), beam) for beam in SEARCHES.values() for _ in range(args.pairs)]
    rng.shuffle(work)
    configs = {"A": (args.a, args.a_tree), "B": (args.b, args.b_tree)}
    with ExitStack() as stack:
        model_dir = args.model_dir or temporary_bundles(stack)
        model_dirs = {"A": model_dir, "B": args.b_model_dir or model_dir}
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nmt-bench-logs-")))
        urls = {
            name: stack.enter_context(
                running_server(
                    model_dirs[name],
                    log_dir,
                    tree or ROOT,
                    **(SERVED | {"threads": threads} | settings(told)),
                )
            ).url
            for name, (told, tree) in configs.items()
        }
        asyncio.run(pairs(urls, work[:20]))  # warm the connections and the shapes
        started = time.perf_counter()
        found = asyncio.run(pairs(urls, work))
        print(f"{len(work)} pairs in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    setup = {"threads": str(threads), "sentences": source}
    setup |= {name: described(told, tree) for name, (told, tree) in configs.items()}
    text = report(found, setup)
    replace_section("lone-client", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
